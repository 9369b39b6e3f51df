"""Evidence: from a run directory to a failure signature.

Run directories (``rundir``), env construction and setup wrappers (``envs``, ``wrappers``),
seeded rollouts and training-log readers (``rollouts``, ``tfevents``), constraint predicates,
the signature features and tags (``features``, ``signature``) and the training callback that
writes a run directory from a user's own script (``callback``).
"""

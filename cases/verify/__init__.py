"""Verification: fine-tuning arms, executors, statistics, the verification of a patch, and the
fault-scenario suite used to benchmark the whole loop.

``training`` trains and fine-tunes, ``arms`` runs one arm (treatment or control) of one seed,
``executors`` runs arms on a local pool or Ray, ``stats`` holds the effect statistics,
``verification`` ties them into a stored case (``config`` says what it spends, ``plan`` turns it into
jobs and shared controls, ``outcome`` turns the arms into effects and a status), ``scenarios``
defines the fault suite, ``templates`` expands the parameterized fault templates into it, and
``solvability`` checks that each patient fails and its oracle patch fixes it.
"""

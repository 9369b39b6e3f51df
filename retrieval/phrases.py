"""The phrase tables a description is read against: symptom tags, their opposites, stated causes.

Written from the tag definitions in ``cases.vocab``, the taxonomy's meaning and common RL
vocabulary (SB3 "Tips and Tricks"), not from the bench reports. A phrasing with a negation
("never", "not") matches only negated clauses (:func:`remedy.retrieval.reading.is_negated`).
"""

from __future__ import annotations

__all__ = ["TAG_PHRASES", "TAG_OPPOSITES"]

#: symptom tag -> short phrasings in a user's words. Written from the tag definitions in
#: ``cases.vocab`` and common RL vocabulary, not from the bench reports. A phrasing with a
#: negation ("never", "not") matches only negated clauses; see :func:`is_negated`.
TAG_PHRASES: dict[str, tuple[str, ...]] = {
    "hovering": (
        "the agent hovers in the air and never lands",
        "the lander keeps flying above the pad until the time runs out",
        "it stays airborne instead of touching down",
        "it stays alive until the episode ends but never finishes the task",
        "it loiters near the goal instead of completing the task",
        "the agent just stands still instead of doing the task",
        "the robot stands still instead of moving toward the goal",
        "it stays in place instead of making progress",
        "the agent prefers to stay still and do nothing",
    ),
    "timeouts": (
        "every episode runs until the time limit",
        "episodes are always truncated at the maximum number of steps",
        "the episode ends by timeout",
        "each episode lasts until the max steps and is reset",
    ),
    "never_succeeds": (
        "the agent never reaches the goal",
        "it never solves the task and the success rate is zero",
        "it does not learn anything, the return stays at its minimum",
        "it does not learn at all",
        "the reward never improves during training",
        "it fails the task in every episode",
    ),
    "low_success": (
        "the agent only succeeds some of the time",
        "it solves the task in some episodes and fails in others",
        "the success rate is low",
        "it reaches the target only occasionally",
    ),
    "jerky_actions": (
        "the actions oscillate rapidly between the extremes",
        "jittery, shaky control that chatters",
        "bang-bang control that switches direction every step",
        "the control signal oscillates at high frequency",
        "the motors vibrate and the motion is shaky",
    ),
    "saturated_actions": (
        "the actions are stuck at their limits",
        "the control output saturates at the maximum or minimum value",
        "actions pinned at the bounds of the action space",
        "it always applies full throttle",
    ),
    "collapsed_entropy": (
        "the policy entropy drops to zero",
        "the agent always picks the same action",
        "the policy became deterministic too early",
        "one action dominates almost all of the policy's decisions",
        "the action distribution collapsed onto a single action",
    ),
    "premature_convergence": (
        "learning plateaued early at a poor return",
        "the agent is stuck in a local optimum",
        "the reward stops improving at a mediocre level",
        "it settled early on a poor strategy and stopped improving",
    ),
    "unstable_learning": (
        "the reward rises and then suddenly collapses",
        "training is unstable and the return oscillates",
        "performance drops catastrophically during training",
        "the loss explodes and training diverges",
        "training is not stable",
        "training is unstable",
        "the episode reward suddenly dropped in the middle of training",
        "the learning curve goes up and down",
        "training does not converge",
        "the agent forgets what it had learned",
    ),
    "reward_hacking_suspected": (
        "the agent exploits the reward without doing the task",
        "it earns a high reward but does not accomplish the task",
        "it found a loophole in the reward",
        "it repeats a rewarded action over and over instead of making progress",
        "it is rewarded again and again for the same thing",
        "the agent games the reward",
        "it keeps doing the same rewarded thing instead of the real task",
        "it goes round in circles collecting reward",
    ),
    "constraint_violations": (
        "the agent violates safety constraints",
        "it keeps colliding and breaking limits",
        "the behaviour is unsafe",
        "it crashes into obstacles and other vehicles",
        # constrained RL measures violations as a cost with a limit (Safety Gym, OmniSafe)
        "the constraint cost stays above the cost limit",
        "the safety cost does not go down during training",
    ),
    "early_termination": (
        "episodes end early because the agent falls or crashes",
        "the agent crashes in every episode",
        "it keeps dying early in the episode",
        "the robot falls over soon after the start",
    ),
    "low_coverage": (
        "the agent explores only a small part of the environment",
        "it keeps doing the same thing in the same place",
        "it does not explore",
        "it never tries other actions",
        "it keeps visiting the same few states",
    ),
    "unscaled_observations": (
        "the observations have very large or very small values",
        "the inputs are not normalized",
        "the observation scale is wrong",
        "the input values fed to the network are almost all zero",
        "the raw pixel values were not scaled",
        "the input features have very different magnitudes",
    ),
    "high_variance": (
        "the return varies wildly between episodes",
        "results differ a lot from run to run",
        "performance is inconsistent",
        "some seeds learn and others do not",
    ),
    "short_episodes": ("episodes are very short", "the agent fails within a few steps"),
    "sparse_signal": (
        "the reward is almost always zero",
        "the reward only arrives at the goal",
        "the same constant reward every step gives no signal toward the goal",
        "it never receives any reward",
        "the only reward is given at the end of the episode",
        "there is no intermediate reward",
        "the reward is sparse",
    ),
    "poor_generalization": (
        "it works in training but fails in a different environment",
        "the policy does not transfer to new levels or another simulator",
        "it fails under unseen conditions",
        "a policy trained in one simulator fails in another simulator",
        "the sim-to-real transfer fails",
        "it does well on the training levels but fails on test levels",
        "the policy behaves well in simulation but badly on the real robot",
    ),
    "undertrained": (
        "it improves slowly and needs more training",
        "the return was still rising when training stopped",
        "not enough training steps",
        "learning is very slow",
        "training was stopped too early",
        "it has only been trained for a few episodes",
    ),
    "numerical_instability": ("NaN values appear in the actions or the loss", "the network outputs NaN or infinity"),
    "short_time_limit": (
        "the time limit is too short to finish the task",
        "the episode is cut off before the agent can reach the goal",
        "there are not enough steps per episode",
    ),
}

#: tag -> phrasings of the opposite. Embeddings place a word near its antonym ("smooth" near "jittery"),
#: so a clause that matches a tag's opposite at least as well as the tag itself does not count for it.
TAG_OPPOSITES: dict[str, tuple[str, ...]] = {
    "jerky_actions": ("the actions are smooth", "the control is smooth and steady"),
    "unstable_learning": ("training is stable", "the learning curve rises steadily"),
    "never_succeeds": ("the agent solves the task", "it reaches the goal"),
    "high_variance": ("the return is consistent across episodes",),
    "unscaled_observations": ("the observations are normalized",),
    "saturated_actions": ("the actions stay well inside their limits",),
    "reward_hacking_suspected": ("it gets no reward at all", "the reward stays at zero"),
    # the tag is about the reward per step; a flat learning curve is about the return over training
    "sparse_signal": (
        "the mean reward hardly changes over the whole run",
        "the episode return does not improve during training",
    ),
    # training steps are not episode steps: "after 700k steps no progress" says nothing of the time limit
    "short_time_limit": ("after many training steps there is still no progress", "it has trained for a long time"),
    "timeouts": ("after many training steps there is still no progress",),
    "short_episodes": (
        "episodes last longer than they should",
        "after many training steps the score is still low",
    ),
}

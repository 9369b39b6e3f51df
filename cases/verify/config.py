"""How much a verification spends, and on which seeds: :class:`VerifyConfig` and the constants behind its defaults.

Each constant states where its value comes from; :mod:`remedy.cases.verify.verification` runs a
verification with a config, :mod:`remedy.cases.verify.plan` turns it into jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import VerificationError
from . import stats
from .budgets import choose_budget
from .fixed import FIX_SHARE

__all__ = [
    "CONFIRM_EVAL_STRIDE",
    "CONFIRM_SEEDS",
    "CONFIRM_DESIGN",
    "CONFIRM_DESIGNS",
    "EARLIER_SCREEN_CONFIDENCE",
    "SCREEN_CONFIDENCE",
    "EVAL_BLOCK_STRIDE",
    "VerifyConfig",
]

#: the k-th confirmation evaluates on episodes seeded from ``eval_seed + k * stride`` (disjoint below this many episodes)
CONFIRM_EVAL_STRIDE = 100_000


#: training seed ``seed_base + i`` and its control are evaluated on episodes seeded from ``arms_eval_seed + i *
#: EVAL_BLOCK_STRIDE``: every seed its own block of evaluation episodes. With one block for all seeds, which
#: start states the block happened to draw was shared by every seed value, so the seed-level interval left it
#: out: on ``cartpole_lr_too_high`` the oracle's treatment won 45-75% of one block's episodes on every seed
#: and 5-25% of another's, so a screen cleared on the first block and its confirmation failed on the second.
#: With a block per seed, each seed value is an independent draw of (training seed, evaluation episodes), so
#: the block's luck is in the seed-to-seed spread the interval measures.
EVAL_BLOCK_STRIDE = 1_000


#: training seeds per arm of a confirmation in the fix loop, ``remedy verify`` and the bench, unless a user
#: asks for others (``--confirm-seeds``); :class:`VerifyConfig` itself defaults to its screen's ``seeds``.
#: The demo's quick fixes helped 5 to 7 seeds of 8; with 3 confirmation seeds every one came out no_effect.
CONFIRM_SEEDS = 8


#: two-sided confidence of the screen's pass test (one-sided 10%); the confirmation keeps ``confidence`` (95%).
#: The screen is a filter that decides which candidates earn a confirmation on fresh seeds; no stored
#: ``improved`` rests on it (:mod:`.stats`: the confirmation's data are new, so its 2.5% holds whatever
#: screened it). A strict screen loses real fixes: at 95% no 3-seed oracle screen of the 55 scenarios
#: cleared under per-seed evaluation blocks (``bench/data/oracle.jsonl``, version 3), while the oracle was
#: ahead on every seed in several of them (e.g. +170 to +460 return on ``invpend_undertrained_5k``). A
#: lenient one costs confirmations on null candidates: ``bench/calibration.py sim --screen-confidence 0.8``
#: measures the A/A screen pass rate (about 10%) and that screen + confirmation stays under the target.
SCREEN_CONFIDENCE = 0.8


#: how a confirmation decides (:attr:`VerifyConfig.confirm_design`). ``fixed``: every confirmation seed is
#: trained, then one test at ``confidence``. ``sequential``: a group-sequential test with looks at half and all
#: of the confirmation seeds (4 and 8 by default), the one-sided ``(1 - confidence) / 2`` spent over the looks by
#: a Pocock-type spending function, and a futility stop at the half-way look when the difference is not above
#: zero (:class:`~remedy.cases.verify.stats.SequentialDesign`): a decisive fix stops at 4 seeds, so do 50-64% of
#: null patches, and each confirmation still false-passes at most ``(1 - confidence) / 2``. Not the default:
#: with the shipped screen it loses a little power (Pocock's first look spends alpha only a decisive effect
#: uses); with a lenient screen (``screen_confidence`` 0.6) it gains power and saves seeds per confirmed fix but
#: still misses the 80% target on bimodal seeds (``bench/calibration.py power``, docs/benchmarks.md).
#: ``sequential3``: three looks, at a third, two thirds and all of the confirmation seeds (4/8/12 with
#: ``confirm_seeds=12``), the same spending and futility stop at each interim look; with
#: :attr:`VerifyConfig.confirm_alpha` it may spend a one-sided level other than ``(1 - confidence) / 2``.
#: Measured (docs/benchmarks.md, "Calibration and power", designs D7-D18): a 4-seed screen at one-sided 35%
#: (``seeds=4, screen_confidence=0.3``) and ``sequential3`` over ``confirm_seeds=18`` at 2.5% reaches 82-83% power
#: on the bimodal fix at <= 3.3% false ``improved`` per patient; the candidate default once the case factory's
#: records are keyed by design. A 5% ``confirm_alpha`` with 2 confirmations breaks the 5% per-patient bound.
CONFIRM_DESIGNS = ("fixed", "sequential", "sequential3")


CONFIRM_DESIGN = "fixed"


#: the level screens passed at before they had their own: the oracle records and cost lines made then are
#: keyed without a screen level, and read at this one
EARLIER_SCREEN_CONFIDENCE = 0.95


@dataclass(frozen=True)
class VerifyConfig:
    """How much verification to spend, and on which seeds.

    ``budget_steps`` None means the budget the patient's scenario declares, else
    ``budget_fraction`` (20%) of the subject's original training steps;
    ``learning_rate`` applies to both arms. Training seeds are ``seed_base ..
    seed_base + seeds - 1``; arms are evaluated on episodes seeded from
    ``arm_eval_seed`` (None: ``eval_seed``, which also seeds the evidence rollouts).
    ``n_boot`` and ``random_state`` are unused by the seed-level interval (it does
    not resample); they are kept so existing configurations still construct.
    """

    seeds: int = 3
    budget_steps: int | None = None
    eval_episodes: int = 20
    n_envs: int = 8
    executor: str = "local"
    learning_rate: float | None = None
    force: bool = False
    budget_fraction: float = 0.2
    eval_seed: int = 10_000
    seed_base: int = 0
    n_boot: int = 2000
    confidence: float = 0.95
    random_state: int = 0
    job_memory_mb: int = 4096
    job_wall_s: float | None = None  # None: generous, from the budget
    arm_eval_seed: int | None = None
    #: the control's training seeds are the treatment's plus this. 0 pairs the arms seed by seed
    #: (common random numbers: a patch that changes nothing gives bit-identical arms); an A/A
    #: calibration sets it so that the two arms are independent draws of the same procedure
    control_seed_offset: int = 0
    #: folder of shared control arms (:mod:`remedy.cases.verify.controls`); None: every
    #: verification trains its own controls. The fix loop and the CLI put it beside the KB.
    control_cache: str | None = None
    #: training seeds per arm of a confirmation; None: ``seeds``. The confirmation decides ``improved``
    #: and runs only for a candidate that cleared its screen, so it can afford more seeds than the
    #: screens: fine-tunes often help some seeds and not others, and a Welch interval over 3 seed
    #: values (2 df, t = 4.3) rarely clears zero even for a real fix (:data:`CONFIRM_SEEDS`)
    confirm_seeds: int | None = None
    #: two-sided confidence of the screen's pass test (which candidates are confirmed); a screen's stored
    #: effect keeps ``confidence``, and so does every status it can take (:data:`SCREEN_CONFIDENCE`)
    screen_confidence: float = SCREEN_CONFIDENCE
    #: share of the patient's gap to its success threshold a confirmed treatment must close to count as fixed
    #: (:mod:`remedy.cases.verify.fixed`; reaching the success definition counts whatever the share)
    fixed_share: float = FIX_SHARE
    #: how a confirmation decides: ``fixed`` (all its seeds, one test) or ``sequential`` (looks at half and all of
    #: them, alpha-spending boundaries, a futility stop half-way; :data:`CONFIRM_DESIGN`); screens are unaffected
    confirm_design: str = CONFIRM_DESIGN
    #: one-sided level a sequential confirmation spends over its looks; None: ``(1 - confidence) / 2`` (2.5%).
    #: The fix loop's false-``improved`` bound per patient is its confirmations times this level
    confirm_alpha: float | None = None

    @property
    def arms_eval_seed(self) -> int:
        """Seed of the arms' first evaluation episode."""
        return self.eval_seed if self.arm_eval_seed is None else self.arm_eval_seed

    def block_eval_seed(self, i: int) -> int:
        """Seed of the first evaluation episode of the ``i``-th training seed (0-based) and its control."""
        return self.arms_eval_seed + EVAL_BLOCK_STRIDE * int(i)

    @property
    def seeds_to_confirm(self) -> int:
        """Training seeds per arm of each confirmation."""
        return self.seeds if self.confirm_seeds is None else self.confirm_seeds

    def confirmation(self, k: int = 0) -> VerifyConfig:
        """The config of the ``k``-th confirmation (0-based): the next disjoint block of
        :attr:`seeds_to_confirm` training seeds after the screen's ``seeds`` and the earlier
        confirmations' blocks, and evaluation episodes no screen or other confirmation uses."""
        c = self.seeds_to_confirm
        return replace(
            self,
            seeds=c,
            seed_base=self.seed_base + self.seeds + c * k,
            arm_eval_seed=self.arms_eval_seed + CONFIRM_EVAL_STRIDE * (k + 1),
        )

    def seeds_spent(self, confirmations: int) -> int:
        """Training seeds a screen and ``confirmations`` confirmations use: the next fresh seed base is
        ``seed_base`` plus this."""
        return self.seeds + self.seeds_to_confirm * confirmations

    @property
    def confirm_level(self) -> float:
        """The one-sided level a sequential confirmation spends: :attr:`confirm_alpha`, else half of 1 - confidence."""
        return (1 - self.confidence) / 2 if self.confirm_alpha is None else self.confirm_alpha

    def sequential(self) -> stats.SequentialDesign | None:
        """The looks of a sequential confirmation with this config's ``seeds`` (a confirmation's config, from
        :meth:`confirmation`): half (rounded up) and all of them, or with ``sequential3`` a third, two thirds
        (rounded up) and all of them; None for the fixed design or under 4 seeds, where half a confirmation
        holds fewer than 2 seeds per arm. ``sequential3`` under 6 seeds keeps two looks (a third would be 1 seed)."""
        n = self.seeds
        if self.confirm_design == "fixed" or n < 4:
            return None
        if self.confirm_design == "sequential3" and n >= 6:
            looks: tuple[int, ...] = (math.ceil(n / 3), math.ceil(2 * n / 3), n)
        else:
            looks = (math.ceil(n / 2), n)
        return stats.SequentialDesign(looks=looks, alpha=self.confirm_level)

    def budget_for(self, train_steps: int | None, declared: int | None = None) -> int:
        """Fine-tuning steps per arm: explicit, else the scenario's declared budget, else a fraction of training
        (:func:`~remedy.cases.verify.budgets.choose_budget` without a budget learned from the KB)."""
        return choose_budget(self, train_steps, declared).steps

    def check(self) -> None:
        """Refuse settings that cannot produce a measurement."""
        if not 0 < self.screen_confidence < 1 or not 0 < self.confidence < 1:
            raise VerificationError("--screen-confidence and the confidence must each be between 0 and 1 (e.g. 0.8)")
        if self.seeds < 1 or self.eval_episodes < 1 or self.n_envs < 1:
            raise VerificationError("--seeds, --episodes and n_envs must each be at least 1")
        if self.confirm_design not in CONFIRM_DESIGNS:
            raise VerificationError(
                f"confirm design '{self.confirm_design}' is unknown; use one of {', '.join(CONFIRM_DESIGNS)}"
            )
        if self.confirm_alpha is not None and (self.confirm_design == "fixed" or not 0 < self.confirm_alpha < 0.5):
            raise VerificationError(
                "confirm_alpha must be between 0 and 0.5 (e.g. 0.05) and goes with a sequential confirm design"
            )
        if self.confirm_seeds is not None and self.confirm_seeds < 2:
            raise VerificationError("--confirm-seeds must be at least 2 (a confirmation needs seed-to-seed spread)")
        if self.seed_base < 0 or self.seed_base + self.control_seed_offset < 0:
            raise VerificationError("--seed-base must be 0 or more")
        if self.budget_steps is not None and self.budget_steps < 1:
            raise VerificationError("--budget must be at least 1 env step (fine-tuning is the treatment)")
        if self.eval_episodes > EVAL_BLOCK_STRIDE:
            raise VerificationError(f"--episodes must be at most {EVAL_BLOCK_STRIDE} (one block of episodes per seed)")
        if max(self.seeds, self.seeds_to_confirm) * EVAL_BLOCK_STRIDE > CONFIRM_EVAL_STRIDE:
            raise VerificationError(
                f"--seeds and --confirm-seeds must be at most {CONFIRM_EVAL_STRIDE // EVAL_BLOCK_STRIDE} "
                "(each seed has its own block of evaluation episodes)"
            )

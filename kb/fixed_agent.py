"""The fixed agent a confirmed fix hands back: ``<out>/fixed/``.

A confirmation trains the patch on fresh seeds and evaluates each treatment
agent on its own block of evaluation episodes. The fix loop keeps those
treatment agents while the confirmation may win; for the winner, this module
writes one of them as a run directory a user can take away:

    fixed/
      model.zip, vecnormalize.pkl   the chosen confirmation seed's fine-tuned agent (and its statistics)
      run.yaml                      the patient's run.yaml with the patch applied (``remedy signature`` reads it)
      patch.yaml                    the patch itself (``remedy verify --patch``)
      apply_sb3.py                  the patch in a plain SB3 fine-tuning script
      rlzoo_hyperparams.yml         the patch as an RL Zoo hyperparameter entry
      fixed.json, README.txt        which seed and why, its figure, and how to reproduce it

Which seed: the **median** one. Of the confirmation's training seeds, ranked by
the figure the confirmation measured (its primary metric on that seed's own
evaluation episodes), the upper median is kept (ties: the lower seed). The best
seed would hand back a lucky draw (the maximum of several noisy figures); the
median is what applying the patch typically gives, which is what the confirmed
effect is about. Every seed's figure is listed beside it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from remedy.cases.algos import is_on_policy
from remedy.cases.errors import RemedyError, VerificationError
from remedy.cases.evidence.checkpoint import read_data
from remedy.cases.evidence.envs import env_traits
from remedy.cases.evidence.rundir import MODEL_ZIP, RUN_YAML, VECNORMALIZE_PKL, RunConfig, RunDir, write_run_yaml
from remedy.cases.evidence.wrappers import WrapperSpec
from remedy.cases.model import Case
from remedy.cases.patches.apply import PatchPlan
from remedy.cases.patches.io import load_patch, save_patch
from remedy.cases.patches.kinds import control_wrapper, patch_kind
from remedy.cases.patches.spec import ActionRepeat, Normalization, Patch, TimeLimit
from remedy.cases.verify.verification import EVAL_BLOCK_STRIDE

__all__ = ["FIXED_DIR", "FixedAgent", "choose_seed", "write_fixed_agent", "reproduce"]

#: the folder under ``--out`` that holds the fixed agent (replaced by each new confirmed fix there)
FIXED_DIR = "fixed"
#: the metadata file of a fixed agent
FIXED_JSON = "fixed.json"
#: why the median seed is the one handed back (written into fixed.json and README.txt)
WHY_MEDIAN = (
    "the upper median of the confirmation's training seeds, ranked by the figure the confirmation measured "
    "for each (ties: the lower seed): the typical result of applying the patch; the best seed would be the "
    "luckiest of several noisy figures"
)


@dataclass(frozen=True)
class FixedAgent:
    """Where a fixed agent was written, which confirmation seed it is, and the figure the confirmation measured."""

    path: Path
    case_id: str
    seed: int
    metric: str
    value: float
    eval_seed: int
    eval_episodes: int
    why: str
    per_seed: dict[str, float]
    #: the patch's parts that are part of how the agent acts (kinds that ``controls``: an action repeat), which a
    #: rollout of the agent keeps (:func:`reproduce` does, from ``patch.yaml``)
    controls: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (what ``fixed.json`` holds)."""
        out = asdict(self)
        out["path"] = str(self.path)
        return out


def choose_seed(case: Case) -> tuple[int, int]:
    """``(index, seed)`` of the confirmation seed to hand back: the upper median by its measured figure."""
    v = case.verification
    values = (v.per_seed.get("treatment") if v is not None else None) or []
    if v is None or not values:
        raise VerificationError(f"case {case.case_id} has no per-seed treatment figures; it cannot hand back an agent")
    ranked = sorted(range(len(values)), key=lambda i: (values[i], -i))
    index = ranked[len(ranked) // 2]
    return index, v.seed_base + index


def write_fixed_agent(
    run: RunDir,
    case: Case,
    arms: Path,
    out: Path,
    *,
    eval_episodes: int,
    learning_rate: float | None = None,
    n_envs: int = 8,
) -> FixedAgent:
    """Write ``out/fixed/`` from the confirmation ``case``'s treatment agents kept in ``arms``.

    ``arms`` holds ``treatment-<seed>/`` run directories (what the confirmation trained);
    ``eval_episodes`` is how many episodes the confirmation evaluated each agent on, ``learning_rate`` and
    ``n_envs`` what it fine-tuned with (its :class:`~remedy.cases.verify.verification.VerifyConfig`). The folder is
    built beside its target and swapped in, so a failure leaves any earlier ``fixed/`` as it was.
    """
    index, seed = choose_seed(case)
    source = Path(arms) / f"treatment-{seed}"
    if not (source / MODEL_ZIP).is_file():
        raise VerificationError(f"the confirmation's agent for seed {seed} was not kept ({source}); verify again")
    v, patch = case.verification, case.patch
    assert v is not None and v.effect is not None  # an improved confirmation has both
    values = v.per_seed["treatment"]
    agent = FixedAgent(
        path=Path(out) / FIXED_DIR,
        case_id=case.case_id,
        seed=seed,
        metric=v.effect.metric,
        value=float(values[index]),
        eval_seed=int(v.eval_seed or 0) + EVAL_BLOCK_STRIDE * index,
        eval_episodes=int(eval_episodes),
        why=WHY_MEDIAN,
        per_seed={str(v.seed_base + i): float(x) for i, x in enumerate(values)},
        controls=_controls(patch),
    )
    Path(out).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fixed-", dir=out))
    try:
        _fill(staging, run, source, patch, agent, _Tuning(v.budget_steps, learning_rate, n_envs))
        _swap(staging, agent.path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return agent


@dataclass(frozen=True)
class _Tuning:
    """How the confirmation fine-tuned each treatment agent: env steps (a budget patch's extra steps included),
    the learning rate it set for both arms (None: the checkpoint's), and the envs of an on-policy fine-tune."""

    steps: int
    learning_rate: float | None
    n_envs: int


def _fill(folder: Path, run: RunDir, source: Path, patch: Patch, agent: FixedAgent, tuning: _Tuning) -> None:
    for name in (MODEL_ZIP, VECNORMALIZE_PKL):
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / name)
    config = fixed_config(run.config, patch, folder / MODEL_ZIP, agent.seed, tuning.learning_rate)
    write_run_yaml(folder, config)
    save_patch(patch, folder / "patch.yaml")
    plan = PatchPlan.from_patch(patch, env_traits(run.config.env_id, run.config.env_kwargs), run.config.algo)
    overrides = _overrides(plan, tuning.learning_rate)
    (folder / "apply_sb3.py").write_text(sb3_snippet(run.config, patch, plan, overrides, tuning))
    (folder / "rlzoo_hyperparams.yml").write_text(zoo_fragment(run.config, patch, plan, overrides, tuning.steps))
    (folder / FIXED_JSON).write_text(json.dumps({**agent.as_dict(), "patch": patch.summary()}, indent=2) + "\n")
    (folder / "README.txt").write_text(_readme(agent, patch, run, tuning.steps))


def _swap(staging: Path, target: Path) -> None:
    """Replace ``target`` with ``staging`` (the old one is removed only once the new one is complete)."""
    old = target.with_name(f".{target.name}-old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _controls(patch: Patch) -> tuple[str, ...]:
    """The parts whose kind the registry marks as part of the agent's control interface, as summaries."""
    return tuple(part.summary() for part in patch.parts if patch_kind(part.kind).controls)


def _overrides(plan: PatchPlan, lr: float | None) -> dict[str, Any]:
    """Constructor values the treatment was fine-tuned with: the verification's learning rate, then the patch's."""
    out: dict[str, Any] = {} if lr is None else {"learning_rate": float(lr)}
    return {**out, **plan.overrides}


def _total_steps(model_zip: Path) -> int | None:
    """``num_timesteps`` from the checkpoint's ``data`` JSON (no unpickling)."""
    try:
        steps = read_data(model_zip).get("num_timesteps")  # bounded read: the zip is a fine-tune's, still a file
    except (OSError, RemedyError):
        return None
    return int(steps) if isinstance(steps, int) else None


def fixed_config(config: RunConfig, patch: Patch, model_zip: Path, seed: int, lr: float | None = None) -> RunConfig:
    """The patient's run config with the patch applied: its hyperparameters, a time limit as a training-only
    setup wrapper (evaluation keeps the task's horizon, as the confirmation did), the steps the fixed agent
    has trained in all, its seed, and a note on the parts a run.yaml cannot hold."""
    plan = PatchPlan.from_patch(patch, env_traits(config.env_id, config.env_kwargs), config.algo)
    wrappers = list(config.wrappers)
    limit = next((p.max_episode_steps for p in patch.parts if isinstance(p, TimeLimit)), None)
    if limit is not None:
        wrappers = [w for w in wrappers if w.kind != "time_limit"]
        wrappers.append(WrapperSpec(kind="time_limit", params={"max_episode_steps": limit}))
    elsewhere = [p.summary() for p in patch.parts if p.kind not in ("hyperparameters", "time_limit", "training_budget")]
    note = f"fixed by Remedy with: {patch.summary()}."
    if elsewhere:
        note += " Applied in training but not expressible here (see patch.yaml, apply_sb3.py): " + "; ".join(elsewhere)
    return config.model_copy(
        update={
            "hyperparams": {**config.hyperparams, **_overrides(plan, lr)},
            "wrappers": wrappers,
            "train_steps": _total_steps(model_zip) or config.train_steps,
            "seed": seed,
            "notes": (config.notes + "\n" if config.notes else "") + note,
        }
    )


# --------------------------------------------------------------------------- applying the patch yourself


def sb3_snippet(config: RunConfig, patch: Patch, plan: PatchPlan, overrides: dict[str, Any], tuning: _Tuning) -> str:
    """A plain SB3 script that fine-tunes a checkpoint with the patch, as the confirmation did."""
    algo = config.algo
    module = (
        "sb3_contrib"
        if algo in ("QRDQN", "TQC", "ARS", "TRPO", "RecurrentPPO", "MaskablePPO", "CrossQ")
        else ("stable_baselines3")
    )
    norm = next((p for p in patch.parts if isinstance(p, Normalization)), None)
    needs_remedy = bool(plan.env_patches) or plan.curriculum is not None
    steps, n_envs = tuning.steps, tuning.n_envs if is_on_policy(algo) else 1
    lines = [
        f'"""Fine-tune your {algo} {config.env_id} checkpoint with the patch Remedy confirmed:',
        f"{patch.summary()}",
        "",
        "Replace CHECKPOINT with your model's path; evaluate on the original task (no patch wrappers).",
        '"""',
        "",
        "import gymnasium as gym",
        "from stable_baselines3.common.env_util import make_vec_env",
        *(["from stable_baselines3.common.vec_env import VecNormalize"] if norm else []),
        f"from {module} import {algo}",
    ]
    if needs_remedy:
        lines += [
            "",
            "# reward shaping, penalties, action repeat or a curriculum: Remedy's own wrappers, as in the confirmation",
            "from remedy.cases.evidence.envs import env_traits",
            "from remedy.cases.patches.apply import PatchPlan, make_patched_env_fn",
            "from remedy.cases.patches.io import load_patch",
        ]
    lines += [
        "",
        'CHECKPOINT = "your_checkpoint.zip"  # the agent before the fix',
        f"ENV_ID = {config.env_id!r}",
        f"ENV_KWARGS = {config.env_kwargs!r}",
    ]
    if needs_remedy:
        lines += [
            f'plan = PatchPlan.from_patch(load_patch("patch.yaml"), env_traits(ENV_ID, ENV_KWARGS), {algo!r})',
            f"env_fn = make_patched_env_fn(ENV_ID, ENV_KWARGS, [], plan, max_episode_steps={plan.max_episode_steps!r})",
            f"venv = make_vec_env(env_fn, n_envs={n_envs})",
        ]
    else:
        limit = f", max_episode_steps={plan.max_episode_steps}" if plan.max_episode_steps else ""
        lines.append(f"venv = make_vec_env(lambda: gym.make(ENV_ID{limit}, **ENV_KWARGS), n_envs={n_envs})")
    if norm:
        lines.append(f"venv = VecNormalize(venv, norm_obs={norm.obs}, norm_reward={norm.reward})")
    lines += [
        f"overrides = {overrides!r}  # the patch's hyperparameters (and the verification's learning rate)",
        f"model = {algo}.load(CHECKPOINT, env=venv, **overrides)",
        f"model.learn(total_timesteps={steps}, reset_num_timesteps=False)",
        'model.save("model_fixed.zip")  # then evaluate it on the original task',
    ]
    if norm:
        lines.append('venv.save("vecnormalize_fixed.pkl")')
    return "\n".join(lines) + "\n"


def zoo_fragment(config: RunConfig, patch: Patch, plan: PatchPlan, overrides: dict[str, Any], steps: int) -> str:
    """The patch as an RL Zoo hyperparameter entry (``hyperparams/<algo>.yml``), with how to continue training."""
    entry: dict[str, Any] = {"n_timesteps": steps, **overrides}
    entry.setdefault("policy", config.hyperparams.get("policy", "MlpPolicy"))
    wrappers: list[Any] = []
    comments = []
    for part in patch.parts:
        if isinstance(part, Normalization):
            entry["normalize"] = (
                True if part.obs and part.reward else str({"norm_obs": part.obs, "norm_reward": part.reward})
            )
        elif isinstance(part, TimeLimit):
            wrappers.append({"gymnasium.wrappers.TimeLimit": {"max_episode_steps": part.max_episode_steps}})
        elif isinstance(part, ActionRepeat):
            wrappers.append({"remedy.cases.patches.wrappers.ActionRepeatWrapper": {"n": part.n}})
        elif part.kind not in ("hyperparameters", "training_budget", "exploration_bonus"):
            comments.append(f"# {part.summary()}: no Zoo setting; train with apply_sb3.py (Remedy's wrappers)")
    if wrappers:
        entry["env_wrapper"] = wrappers
    head = [
        f"# Remedy's confirmed patch for {config.env_id} ({config.algo}): {patch.summary()}",
        "# Put this entry into hyperparams/<algo>.yml and continue training your agent with, e.g.:",
        f"#   python -m rl_zoo3.train --algo {config.algo.lower()} --env {config.env_id} -i CHECKPOINT.zip -n {steps}",
        *comments,
    ]
    return "\n".join(head) + "\n" + yaml.safe_dump({config.env_id: entry}, sort_keys=False)


def _readme(agent: FixedAgent, patch: Patch, run: RunDir, steps: int) -> str:
    figures = ", ".join(f"seed {s}: {x:.4g}" for s, x in agent.per_seed.items())
    repeat = (
        f"\nThe agent acts through {', '.join(agent.controls)} (part of the patch): roll it out with it.\n"
        if agent.controls
        else ""
    )
    return (
        f"Fixed agent from Remedy (confirmation case {agent.case_id})\n\n"
        f"Patient: {run.path} ({run.config.env_id}, {run.config.algo})\n"
        f"Patch: {patch.summary()} (patch.yaml), fine-tuned {steps:,} env steps per seed\n\n"
        f"model.zip is confirmation training seed {agent.seed}: {agent.why}.\n"
        f"Its {agent.metric} on the original task was {agent.value:.4g} over {agent.eval_episodes} deterministic "
        f"episodes seeded from {agent.eval_seed}.\nAll confirmation seeds: {figures}.\n{repeat}\n"
        "Files: run.yaml (`remedy signature` / `remedy diagnose` read this folder), patch.yaml, "
        "apply_sb3.py (the patch in your own SB3 script), rlzoo_hyperparams.yml (an RL Zoo entry), fixed.json.\n"
        "Reproduce the figure: python -c \"from remedy.kb.fixed_agent import reproduce; print(reproduce('.'))\"\n"
    )


def reproduce(folder: str | Path) -> float:
    """The fixed agent's figure, recomputed from the folder alone: its deterministic rollouts on the original
    task at the confirmation's evaluation seeds (``fixed.json``), scored by the confirmation's metric."""
    from remedy.cases.evidence.rollouts import rollout
    from remedy.cases.verify import stats

    folder = Path(folder)
    meta = json.loads((folder / FIXED_JSON).read_text())
    run = RunDir.load(folder)
    control = control_wrapper(load_patch(folder / "patch.yaml"))  # how the agent acts, as the confirmation had it

    def factory() -> Any:
        return control(run.make_env(for_evaluation=True))

    vn = None
    if run.vecnormalize_path is not None:
        from stable_baselines3.common.vec_env import DummyVecEnv

        vn = run.load_vecnormalize(DummyVecEnv([run.make_env]))
    records = rollout(
        run.load_model(),
        factory,
        n_episodes=int(meta["eval_episodes"]),
        seed=int(meta["eval_seed"]),
        deterministic=True,
        success=run.config.success,
        constraints=run.config.constraints,
        keep_trajectories=0,
        vecnormalize=vn,
    )
    if meta["metric"] == "success_rate":
        return float(stats.mean([float(bool(r.success)) for r in records]))
    return float(stats.iqm([float(r.ret) for r in records]))


#: the files of a fixed agent (for tests and docs)
FILES = (MODEL_ZIP, RUN_YAML, "patch.yaml", "apply_sb3.py", "rlzoo_hyperparams.yml", FIXED_JSON, "README.txt")

"""Pictures of the failure: one self-contained HTML page per diagnosis of a run directory.

People would rather look at a failing episode than read its features. ``remedy diagnose RUN
--report DIR`` writes ``DIR/diagnosis.html``: the diagnosis (ranked causes, candidate patches,
cited cases and rules), the signature, plots of typical failing episodes (reward and return,
actions, the observation dimensions that moved most) and, where the env renders headless, a
short GIF of the worst one. Classic control and Box2D render with ``render_mode="rgb_array"``;
MuJoCo needs an OpenGL backend (``MUJOCO_GL=egl`` or ``osmesa``), and where it has none the page
says so instead of showing frames. Images are embedded as data URIs, so the file travels alone.
"""

from __future__ import annotations

import base64
import html
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from remedy.cases.errors import ReportPathError
from remedy.cases.evidence.envs import make_env
from remedy.cases.evidence.rollouts import EpisodeRecord, collect_evidence
from remedy.cases.evidence.rundir import RunDir
from remedy.retrieval.diagnosis import DiagnosisReport

__all__ = ["DiagnosisPage", "write_diagnosis_page", "typical_failures"]

#: most frames in the GIF (every k-th step is kept) and most observation dims plotted
MAX_FRAMES = 60
MAX_OBS_DIMS = 6


@dataclass
class DiagnosisPage:
    """What was written: the page, how many episode plots, whether frames were rendered and why not."""

    html: Path
    episodes: list[int] = field(default_factory=list)
    gif: bool = False
    notes: list[str] = field(default_factory=list)


def typical_failures(episodes: list[EpisodeRecord], n: int = 2) -> list[EpisodeRecord]:
    """Up to ``n`` failed episodes with trajectories: the median one by return, then the worst.

    All episodes stand in when none failed (the page then shows what the agent does).
    """
    kept = [e for e in episodes if e.rewards is not None]
    failed = [e for e in kept if not e.success] or kept
    ranked = sorted(failed, key=lambda e: e.ret)
    picks = [ranked[len(ranked) // 2], ranked[0]] if ranked else []
    out: list[EpisodeRecord] = []
    for e in picks:
        if e not in out:
            out.append(e)
    return out[:n]


def write_diagnosis_page(
    run: RunDir, report: DiagnosisReport, out_dir: Path, *, episodes: int = 6, seed: int = 0, frames: bool = True
) -> DiagnosisPage:
    """Roll ``episodes`` seeded deterministic episodes out, plot the typical failures, write the page."""
    out_dir = _writable(out_dir)
    bundle = collect_evidence(run, n_episodes=episodes, seed=seed, stochastic=False, keep_trajectories=episodes)
    chosen = typical_failures(bundle.deterministic)
    page = DiagnosisPage(html=out_dir / "diagnosis.html", episodes=[e.seed for e in chosen])
    plots = [(e, _episode_plot(e)) for e in chosen]
    gif = None
    if frames and chosen:
        gif, why = _episode_gif(run, chosen[-1])
        page.gif = gif is not None
        if why:
            page.notes.append(why)
    text = _render(run, report, plots, gif, page.notes)
    tmp = page.html.with_suffix(".html.tmp")
    tmp.write_text(text)
    tmp.replace(page.html)  # never a half-written page under the real name
    return page


def _writable(out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportPathError(f"--report {out_dir} is a file; give a directory for diagnosis.html")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as ex:
        raise ReportPathError(f"cannot create --report {out_dir}: {ex.strerror}; choose a writable directory") from ex
    return out_dir


# ---------------------------------------------------------------- plots


def _episode_plot(e: EpisodeRecord) -> str:
    """A three-panel PNG (rewards and return, actions, observation dims) as a data URI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    rewards = np.asarray(e.rewards, dtype=float)
    steps = np.arange(len(rewards))
    axes[0].plot(steps, rewards, color="#1f77b4", lw=1, label="reward per step")
    twin = axes[0].twinx()
    twin.plot(steps, np.cumsum(rewards), color="#d62728", lw=1.5, label="return so far")
    axes[0].set_ylabel("reward")
    twin.set_ylabel("return", color="#d62728")
    _plot_actions(axes[1], e.actions)
    _plot_obs(axes[2], e.observations)
    axes[2].set_xlabel("step")
    fig.suptitle(f"episode seed {e.seed}: return {e.ret:.1f}, {e.length} steps, {e.termination}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _plot_actions(ax: Any, actions: np.ndarray | None) -> None:
    ax.set_ylabel("action")
    if actions is None:
        return
    a = np.asarray(actions, dtype=float)
    if a.ndim == 1:
        ax.step(np.arange(len(a)), a, where="post", lw=1, color="#2ca02c")
        return
    for i in range(min(a.shape[1], MAX_OBS_DIMS)):
        ax.plot(a[:, i], lw=1, label=f"a[{i}]")
    ax.legend(loc="upper right", fontsize=7, ncol=3)


def _plot_obs(ax: Any, obs: np.ndarray | None) -> None:
    ax.set_ylabel("observation")
    if obs is None:
        return
    o = np.asarray(obs, dtype=float).reshape(len(obs), -1)
    # the dims that moved most: what the agent's behaviour is made of
    dims = np.argsort(-np.nan_to_num(o.std(axis=0)))[:MAX_OBS_DIMS]
    for i in sorted(dims):
        ax.plot(o[:, i], lw=1, label=f"obs[{i}]")
    ax.legend(loc="upper right", fontsize=7, ncol=3)


# ---------------------------------------------------------------- frames


def _episode_gif(run: RunDir, e: EpisodeRecord) -> tuple[str | None, str]:
    """Replay episode ``e`` (same reset seed, deterministic policy) rendering frames; (data URI, note)."""
    c = run.config
    # pygame (classic control, Box2D) probes for audio and a display even to draw off-screen; with
    # no session it prints "error: XDG_RUNTIME_DIR is invalid" on stderr, which reads like ours
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    try:
        env = make_env(
            c.env_id,
            {**c.env_kwargs, "render_mode": "rgb_array"},
            wrappers=c.wrappers,
            for_evaluation=True,
            max_episode_steps=c.max_episode_steps,
        )
    except Exception as ex:  # an env without rgb_array rendering: say so, keep the page
        return None, f"no frames: {c.env_id} does not render headless here ({type(ex).__name__}: {ex})"
    try:
        frames = _frames(run, env, e)
    except Exception as ex:  # MuJoCo without an OpenGL backend fails at the first render
        return (
            None,
            f"no frames: rendering {c.env_id} failed ({type(ex).__name__}); MuJoCo needs MUJOCO_GL=egl or osmesa",
        )
    finally:
        env.close()
    if not frames:
        return None, f"no frames: {c.env_id} returned no image"
    from PIL import Image

    images = [Image.fromarray(f) for f in frames]
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=80, loop=0)
    return "data:image/gif;base64," + base64.b64encode(buf.getvalue()).decode(), ""


def _frames(run: RunDir, env: Any, e: EpisodeRecord) -> list[np.ndarray]:
    model = run.load_model()
    vecnorm = None
    if run.vecnormalize_path is not None:
        from stable_baselines3.common.vec_env import DummyVecEnv

        vecnorm = run.load_vecnormalize(DummyVecEnv([run.make_env]))
    every = max(1, e.length // MAX_FRAMES)
    obs, _ = env.reset(seed=e.seed)
    frames, step, done = [], 0, False
    while not done and step <= e.length:
        if step % every == 0:
            frame = env.render()
            if frame is not None:
                frames.append(np.asarray(frame)[::2, ::2])  # half size keeps the page light
        x = vecnorm.normalize_obs(obs) if vecnorm is not None else obs
        action, _ = model.predict(x, deterministic=True)
        obs, _, terminated, truncated, _ = env.step(action)
        done, step = terminated or truncated, step + 1
    return frames


# ---------------------------------------------------------------- page


def _render(run: RunDir, report: DiagnosisReport, plots: list, gif: str | None, notes: list[str]) -> str:
    c, d, sig = run.config, report.diagnosis, report.signature
    esc = html.escape
    causes = "".join(
        f"<tr><td>{i}</td><td>{esc(x.cause.value)}</td><td>{x.confidence:.2f}</td><td>{esc(x.rationale)}</td></tr>"
        for i, x in enumerate(d.causes, 1)
    )
    candidates = "".join(
        f"<tr><td>{i}</td><td>{esc(p.family.value)}</td><td>{esc(p.patch.summary())}</td>"
        f"<td>{p.score:.2f}</td><td>{esc(p.rationale)}</td></tr>"
        for i, p in enumerate(report.candidates, 1)
    )
    features = "".join(
        f"<tr><td>{esc(k)}</td><td>{v:.3g}</td></tr>" for k, v in sorted(sig.features.items()) if np.isfinite(v)
    )
    figures = "".join(
        f'<figure><img class="episode-plot" alt="episode {e.seed}" src="{uri}"><figcaption>episode seed '
        f"{e.seed}: return {e.ret:.1f} over {e.length} steps, {e.termination}, "
        f"{'success' if e.success else 'failure'}</figcaption></figure>"
        for e, uri in plots
    )
    movie = f'<img id="frames" alt="frames of the worst episode" src="{gif}">' if gif else ""
    cited = ", ".join(esc(x) for x in [*d.cited_cases, *d.cited_rules]) or "none"
    note_html = "".join(f"<li>{esc(n)}</li>" for n in [*notes, *report.warnings])
    return _PAGE.format(
        title=esc(f"Remedy diagnosis: {c.env_id} ({c.algo})"),
        run=esc(str(run.path)),
        summary=esc(sig.summary),
        symptoms=esc(", ".join(sig.symptoms) or "none"),
        backend=esc(d.backend),
        causes=causes,
        candidates=candidates or '<tr><td colspan="5">no candidate patch</td></tr>',
        cited=cited,
        figures=figures or "<p>No episode trajectories were kept.</p>",
        movie=movie,
        notes=f"<ul>{note_html}</ul>" if note_html else "",
        features=features,
    )


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
td, th {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }}
th {{ background: #eef3f8; }}
figure {{ margin: 1em 0; }} img {{ max-width: 100%; }}
.summary {{ background: #f7f7f7; padding: 0.8em; border-left: 4px solid #d62728; }}
</style></head><body>
<h1>{title}</h1>
<p>Run directory: <code>{run}</code>. Diagnosed by the <b>{backend}</b> diagnoser.</p>
<p class="summary">{summary}</p>
<p>Symptoms: {symptoms}</p>
<h2>Root causes</h2>
<table id="causes"><tr><th>#</th><th>cause</th><th>confidence</th><th>why</th></tr>{causes}</table>
<h2>Candidate patches</h2>
<table id="candidates"><tr><th>#</th><th>family</th><th>patch</th><th>score</th><th>why</th></tr>{candidates}</table>
<p>Cases and rules relied on: {cited}</p>
<h2>Typical failing episodes</h2>
{figures}
{movie}
{notes}
<h2>Signature features</h2>
<table id="features"><tr><th>feature</th><th>value</th></tr>{features}</table>
</body></html>
"""

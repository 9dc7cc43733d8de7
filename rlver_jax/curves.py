"""Training curves: reward (and the held-out score) against step, as a PNG from metrics.jsonl."""

from __future__ import annotations

import io
import os
import pathlib

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rlver_jax.files import atomic_write_bytes, read_jsonl


def plot_training_curves(metrics_path: str | os.PathLike, out_png: str | os.PathLike,
                         title: str = "") -> pathlib.Path:
    """Mean reward per step with a 10-step moving average; the in-loop evaluation score and the
    format-failure rate where logged."""
    rows = read_jsonl(metrics_path)
    if not rows:
        raise ValueError(f"{metrics_path}: no metrics to plot")
    steps = [r["step"] for r in rows]
    reward = [r["reward_mean"] for r in rows]
    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(steps, reward, color="#9ecae1", label="reward (batch mean)")
    window = 10
    if len(reward) >= window:
        avg = [sum(reward[i - window + 1:i + 1]) / window for i in range(window - 1, len(reward))]
        ax.plot(steps[window - 1:], avg, color="#08519c", label=f"reward ({window}-step mean)")
    evals = [(r["step"], r["eval_score"] / 100) for r in rows if "eval_score" in r]
    if evals:
        ax.plot(*zip(*evals), "o-", color="#e6550d", label="held-out score / 100")
    if any("format_failure_rate" in r for r in rows):
        ax.plot(steps, [r.get("format_failure_rate", 0.0) for r in rows], color="#bdbdbd",
                linestyle="--", label="format failure rate")
    ax.set_xlabel("train step")
    ax.set_ylabel("reward = final emotion / 100")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    return atomic_write_bytes(out_png, buf.getvalue())

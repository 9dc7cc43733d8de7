"""PNG figures of training and evaluation results: training curves (launch/train.py), emotion
trajectories, final emotions, paired comparisons, judged capabilities and response strategies
(rlver_jax.eval).

Figures are built on matplotlib's object API with the Agg canvas (no pyplot, no global backend,
no display needed) and written atomically.
"""

from __future__ import annotations

import io
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # matplotlib loads at the first plot, not with the reports that import end_color
    from matplotlib.figure import Figure

from rlver_jax.files import atomic_write_bytes, read_jsonl

# One colour per way a dialogue can end (rlver_jax.rollout.sequence.DialogueSequence.end_reason).
END_COLORS = {
    "success": "#2a9d4a", "turn_limit": "#1f77b4", "goodbye": "#ff7f0e", "failure": "#d62728",
    "truncated": "#9467bd", "format_failure": "#8c564b", "simulator_error": "#7f7f7f",
}


# How a legend names each way a dialogue can end (the end_reason identifiers in words).
END_LABELS = {
    "success": "success (reached 100)", "turn_limit": "turn limit", "goodbye": "goodbye",
    "failure": "user left (floor)", "truncated": "token budget full", "format_failure": "format failure",
    "simulator_error": "simulator error",
}


def end_label(end_reason: str) -> str:
    return END_LABELS.get(end_reason, end_reason.replace("_", " "))


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: pathlib.Path) -> pathlib.Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())


def end_color(end_reason: str) -> str:
    return END_COLORS.get(end_reason, "#17becf")


def emotion_trajectories(transcripts: Sequence[dict[str, Any]], path: pathlib.Path, *, title: str,
                         levels: Sequence[float]) -> pathlib.Path:
    """One line per dialogue (emotion after each judged turn), coloured by how it ended, and the
    mean over dialogues with each final emotion carried forward (as SAGE scores it); dotted lines
    at the band `levels`."""
    fig = _figure(8, 4.5)
    ax = fig.add_subplot()
    rows = [t for t in transcripts if not t["simulator_error"] and t["emotions"]]
    for t in rows:
        ax.plot(range(len(t["emotions"])), t["emotions"], color=end_color(t["end_reason"]), alpha=0.45,
                linewidth=1.0, marker="o", markersize=2.5)
    if rows:
        width = max(len(t["emotions"]) for t in rows)
        padded = np.array([t["emotions"] + [t["emotions"][-1]] * (width - len(t["emotions"])) for t in rows],
                          dtype=float)
        ax.plot(range(width), padded.mean(axis=0), color="black", linewidth=2.5, label="mean (final carried)")
        for reason in sorted({t["end_reason"] for t in rows}):
            ax.plot([], [], color=end_color(reason), label=end_label(reason))
        ax.legend(loc="lower left", fontsize=8, ncol=2)
    for level in levels:
        ax.axhline(level, color="grey", linestyle=":", linewidth=0.8)
    ax.set(xlabel="judged policy turn", ylabel="emotion", ylim=(-2, 102), title=title)
    return _save(fig, path)


def final_emotion_histogram(transcripts: Sequence[dict[str, Any]], path: pathlib.Path, *,
                            title: str) -> pathlib.Path:
    """Final emotions in bins of 10 (the last bin holds 100), stacked by how the dialogue ended,
    with the score (their mean) marked."""
    fig = _figure(7, 4)
    ax = fig.add_subplot()
    rows = [t for t in transcripts if not t["simulator_error"]]
    reasons = sorted({t["end_reason"] for t in rows})
    values = [[float(np.clip(t["final_emotion"], 0, 100)) for t in rows if t["end_reason"] == r] for r in reasons]
    if rows:
        ax.hist(values, bins=np.arange(0, 101, 10), stacked=True, color=[end_color(r) for r in reasons],
                label=[end_label(r) for r in reasons], edgecolor="white")
        score = float(np.mean([t["final_emotion"] for t in rows]))
        ax.axvline(score, color="black", linestyle="--", label=f"score {score:.1f}")
        ax.legend(fontsize=8)
    ax.set(xlabel="final emotion", ylabel="dialogues", xlim=(0, 100), title=title)
    return _save(fig, path)


def paired_scatter(baseline: str, finals: Mapping[str, Sequence[float]], path: pathlib.Path) -> pathlib.Path:
    """Per profile: the baseline run's final emotion (x) against each other run's (y); points
    above the diagonal are profiles the other run did better on. `finals[label]` are aligned by
    profile; the baseline's entry is the x axis."""
    fig = _figure(5.5, 5.5)
    ax = fig.add_subplot()
    x = np.asarray(finals[baseline], dtype=float)
    for label, ys in finals.items():
        if label != baseline:
            ax.scatter(x, np.asarray(ys, dtype=float), alpha=0.6, s=22, label=label)
    ax.plot([0, 100], [0, 100], color="grey", linestyle=":")
    ax.set(xlabel=f"{baseline}: final emotion", ylabel="final emotion", xlim=(-2, 102), ylim=(-2, 102),
           title="paired per profile")
    ax.legend(fontsize=8)
    return _save(fig, path)


def capability_radar(labels: Sequence[str], scores: Mapping[str, Sequence[float]], path: pathlib.Path) -> pathlib.Path:
    """One polygon per model over the capability axes `labels` (scale 1 to 5)."""
    fig = _figure(6, 6)
    ax = fig.add_subplot(projection="polar")
    angles = np.linspace(0, 2 * np.pi, len(labels), endpoint=False)
    closed = np.concatenate([angles, angles[:1]])
    for model, values in scores.items():
        v = np.asarray(values, dtype=float)
        ax.plot(closed, np.concatenate([v, v[:1]]), linewidth=1.5, label=model)
        ax.fill(closed, np.concatenate([v, v[:1]]), alpha=0.1)
    ax.set_xticks(angles)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylim(0, 5)
    ax.set_yticks([1, 2, 3, 4, 5])
    ax.set_title("judged dialogue capabilities (1 to 5)", pad=24)
    ax.legend(loc="upper right", bbox_to_anchor=(1.3, 1.1), fontsize=8)
    return _save(fig, path)


def strategy_bars(strategies: Sequence[str], rates: Mapping[str, Sequence[float]], path: pathlib.Path) -> pathlib.Path:
    """Grouped bars: how often each model uses each response strategy, per policy reply."""
    fig = _figure(max(7.0, 0.7 * len(strategies) * max(len(rates), 1)), 4)
    ax = fig.add_subplot()
    x = np.arange(len(strategies))
    width = 0.8 / max(len(rates), 1)
    for i, (model, values) in enumerate(rates.items()):
        ax.bar(x + (i - (len(rates) - 1) / 2) * width, values, width, label=model)
    ax.set_xticks(x)
    ax.set_xticklabels(strategies, rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="uses per policy reply", title="response strategies")
    ax.legend(fontsize=8)
    return _save(fig, path)


def training_figure(rows: Sequence[Mapping[str, Any]], *, title: str = "") -> Figure:
    """A run's curves against train step, one panel per quantity, each line in its panel's legend:
    the training reward (batch mean, and its 10-step mean once there are more than 10 steps, so
    that the legend names only lines drawn), labelled as what it is: final emotion / 100, and 0
    for a dialogue a format failure ended; the mean final emotion of the training batches beside
    the in-loop held-out score, where logged (both final emotions on 0-100, the pair whose gap
    shows reward hacking; never drawn on the reward's axis); the shares of format failures and of
    dialogues rewarded below 0.1, where logged (what pulls the reward below emotion / 100)."""
    steps = [r["step"] for r in rows]
    evals = [(r["step"], r["eval_score"]) for r in rows if r.get("eval_score") is not None]
    # (key, label, colour, line style): format failures dashed over the reward-zero share they often equal
    shares = [share for share in (("failure_rate_reward", "dialogues rewarded < 0.1", "#d62728", "-"),
                                  ("format_failure_rate", "format failures", "#636363", "--"))
              if any(share[0] in r for r in rows)]
    panels = ["reward"] + (["emotion"] if evals or any("emotion_mean" in r for r in rows) else []) + \
        (["shares"] if shares else [])
    fig = _figure(7, 2.6 * len(panels) + 0.4)
    axes = dict(zip(panels, fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]))
    window = 10

    def with_mean(ax, values, color, mean_color, label):
        ax.plot(steps, values, color=color, label=f"{label} (batch mean)")
        if len(values) > window:  # a mean of one point draws nothing: no legend entry for it
            avg = np.convolve(values, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1:], avg, color=mean_color, label=f"{label} ({window}-step mean)")

    ax = axes["reward"]
    with_mean(ax, [r["reward_mean"] for r in rows], "#9ecae1", "#08519c", "reward")
    ax.set(ylabel="reward: final emotion / 100,\n0 if a format failure ended it", title=title)
    if "emotion" in axes:
        ax = axes["emotion"]
        if any("emotion_mean" in r for r in rows):
            with_mean(ax, [r.get("emotion_mean", np.nan) for r in rows], "#fdd0a2", "#d94801", "training")
        if evals:
            ax.plot(*zip(*evals), "o-", color="#54278f", label="held-out score (in-loop evaluation)")
        ax.set(ylabel="final emotion\n(0-100)")
    if "shares" in axes:
        ax = axes["shares"]
        for key, label, color, style in shares:
            ax.plot(steps, [r.get(key, np.nan) for r in rows], color=color, linestyle=style,
                    label=f"{label} (training batch)")
        ax.set(ylabel="share of dialogues", ylim=(-0.02, 1.02))
    for ax in axes.values():
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    axes[panels[-1]].set_xlabel("train step")
    return fig


def training_curves(metrics_path: str | os.PathLike, path: str | os.PathLike, *, title: str = "") -> pathlib.Path:
    """`training_figure` of a run's metrics.jsonl, as a PNG (WORKDIR/reward.png)."""
    rows = read_jsonl(metrics_path)
    if not rows:
        raise ValueError(f"{metrics_path}: no metrics to plot")
    return _save(training_figure(rows, title=title), pathlib.Path(path))

"""A training run's numbers: per-step metrics of a rollout batch, and where they are written
(WORKDIR/metrics.jsonl, TensorBoard events, the progress bar)."""

from __future__ import annotations

import math
import pathlib

from collections.abc import Sequence
from typing import Any

import jax

from rlver_jax import tracking
from rlver_jax.files import append_jsonl
from rlver_jax.rollout.sequence import DialogueSequence

# The metrics the progress bar shows, when logged.
PROGRESS_KEYS = ("reward_mean", "emotion_mean", "success_rate", "failure_rate", "entropy", "tokens_per_second")


def tensorboard_tag(key: str) -> str:
    """The TensorBoard tag of a metric, grouped into sections: eval/score for eval_score (the
    in-loop evaluation), speed/... for the timings of `throughput_metrics`, train/... for the rest."""
    if key.startswith("eval_"):
        return f"eval/{key[len('eval_'):]}"
    if key in _THROUGHPUT_KEYS:
        return f"speed/{key}"
    return f"train/{key}"


def throughput_metrics(tokens: float, rollout_s: float, update_s: float, wait_s: float) -> dict[str, float]:
    """Tokens per second of a step (rollout + update, and the update alone) and its timings."""
    return {"tokens_per_second": tokens / max(rollout_s + update_s, 1e-9),
            "update_tokens_per_second": tokens / max(update_s, 1e-9),
            "rollout_seconds": rollout_s, "update_seconds": update_s, "wait_seconds": wait_s}


_THROUGHPUT_KEYS = frozenset(throughput_metrics(0.0, 0.0, 0.0, 0.0))


def check_finite(step: int, metrics: dict[str, float]) -> None:
    """Stop a run whose loss or norms went non-finite, naming the metrics."""
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    if bad:
        raise FloatingPointError(f"step {step}: non-finite training metrics {bad}")


class Writers:
    """metrics.jsonl (appended and flushed every step), TensorBoard events, the progress bar and,
    when `tracking` is on, Weights & Biases (metrics every step, a table of the batch's dialogues
    every `table_every` steps); process 0 writes, the others do nothing."""

    def __init__(self, workdir: pathlib.Path, *, start: int, total: int, progress: bool = True,
                 tracking_settings: tracking.TrackingSettings | None = None,
                 config: dict[str, Any] | None = None, table_every: int = 0):
        from tensorboardX import SummaryWriter
        from tqdm import tqdm

        self.metrics_path = workdir / "metrics.jsonl"
        self.writes = jax.process_index() == 0
        self.tb = SummaryWriter(str(workdir / "tensorboard")) if self.writes else None
        self.bar = tqdm(total=total, initial=start, disable=not progress or not self.writes, desc="train",
                        dynamic_ncols=True)
        self.tracker = (tracking.WandbLogger.create(tracking_settings, config)
                        if self.writes and tracking_settings is not None else None)
        self.table_every = table_every

    def write(self, step: int, metrics: dict[str, float], dialogues: Sequence[DialogueSequence] = ()) -> None:
        self.bar.update(1)
        self.bar.set_postfix({k: f"{metrics[k]:.3g}" for k in PROGRESS_KEYS if k in metrics}, refresh=False)
        if not self.writes:
            return
        append_jsonl(self.metrics_path, {"step": step, **metrics})
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.tb.add_scalar(tensorboard_tag(k), v, step)
        self.tb.flush()
        if self.tracker is not None:
            self.tracker.log(step, metrics)
            if dialogues and self.table_every and (step + 1) % self.table_every == 0:
                self.tracker.log_transcripts(step, [{**d.to_record(), "reward": d.reward} for d in dialogues])

    def close(self) -> None:
        self.bar.close()
        if self.tb is not None:
            self.tb.close()
        if self.tracker is not None:
            self.tracker.close()

"""A training run's numbers: per-step metrics of a rollout batch, and where they are written
(WORKDIR/metrics.jsonl, TensorBoard events, the progress bar)."""

from __future__ import annotations

import math
import pathlib

import jax

from rlver_jax.files import append_jsonl
from rlver_jax.rollout.sequence import DialogueSequence

# The metrics the progress bar shows, when logged.
PROGRESS_KEYS = ("reward_mean", "emotion_mean", "success_rate", "failure_rate", "entropy", "tokens_per_second")


def rollout_metrics(seqs: list[DialogueSequence]) -> dict[str, float]:
    """Rewards, emotions and outcome rates of a batch's dialogues; those the simulator failed on
    are left out of the reward and outcome means."""
    n = max(len(seqs), 1)
    scored = [s for s in seqs if not s.simulator_error]
    m = max(len(scored), 1)
    return {
        "reward_mean": sum(s.reward for s in scored) / m,
        "emotion_mean": sum(s.final_emotion for s in scored) / m,
        "success_rate": sum(s.end_reason == "success" for s in scored) / m,
        "failure_rate": sum(s.end_reason == "failure" for s in scored) / m,
        "format_failure_rate": sum(s.format_failure for s in seqs) / n,
        "truncated_rate": sum(s.truncated for s in seqs) / n,
        "simulator_errors": float(len(seqs) - len(scored)),
        "turns_mean": sum(len(s.turn_ends) for s in seqs) / n,
        "sequence_tokens_mean": sum(len(s.tokens) for s in seqs) / n,
    }


def throughput_metrics(tokens: float, rollout_s: float, update_s: float, wait_s: float) -> dict[str, float]:
    """Tokens per second of a step (rollout + update, and the update alone) and its timings."""
    return {"tokens_per_second": tokens / max(rollout_s + update_s, 1e-9),
            "update_tokens_per_second": tokens / max(update_s, 1e-9),
            "rollout_seconds": rollout_s, "update_seconds": update_s, "wait_seconds": wait_s}


def check_finite(step: int, metrics: dict[str, float]) -> None:
    """Stop a run whose loss or norms went non-finite, naming the metrics."""
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    if bad:
        raise FloatingPointError(f"step {step}: non-finite training metrics {bad}")


class Writers:
    """metrics.jsonl (appended and flushed every step), TensorBoard events and the progress bar;
    process 0 writes, the others do nothing."""

    def __init__(self, workdir: pathlib.Path, *, start: int, total: int, progress: bool = True):
        from tensorboardX import SummaryWriter
        from tqdm import tqdm

        self.metrics_path = workdir / "metrics.jsonl"
        self.writes = jax.process_index() == 0
        self.tb = SummaryWriter(str(workdir / "tensorboard")) if self.writes else None
        self.bar = tqdm(total=total, initial=start, disable=not progress or not self.writes, desc="train",
                        dynamic_ncols=True)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        self.bar.update(1)
        self.bar.set_postfix({k: f"{metrics[k]:.3g}" for k in PROGRESS_KEYS if k in metrics}, refresh=False)
        if not self.writes:
            return
        append_jsonl(self.metrics_path, {"step": step, **metrics})
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.tb.add_scalar(k, v, step)
        self.tb.flush()

    def close(self) -> None:
        self.bar.close()
        if self.tb is not None:
            self.tb.close()

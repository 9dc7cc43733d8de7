"""A training run's numbers: per-step metrics of a rollout batch, and where they are written
(WORKDIR/metrics.jsonl, TensorBoard events, the progress bar).

metrics.jsonl holds each step once. A step's line is written before its checkpoint, so a run
killed in between leaves lines of steps its newest checkpoint does not hold (and a kill mid-append
a torn last line): a run starting at step S first drops every line of a step >= S and the torn
line (`keep_steps_before`), then appends its own; TensorBoard hides the events of those steps.

A write that fails (a full or read-only disk) raises its OSError from `Writers.write`, naming the
path. TensorBoard's events are written by tensorboardX's own thread: its failure is caught there
(no traceback printed) and raised by the next `write`, and its queue is large enough for a step's
scalars, so a dead writer never blocks the loop (with tensorboardX's 10 it hung for good).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import pathlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax

from rlver_jax import inflight
from rlver_jax.files import append_jsonl, atomic_write_jsonl, is_torn, raw_lines
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.train import tracking

log = logging.getLogger(__name__)

# The metrics the progress bar shows, when logged, by the name it shows them under: the reward (0 for
# a dialogue a format failure ended), the final emotion, the shares of dialogues rewarded below 0.1 and
# of format failures (which explain a reward far below emotion / 100), of users who left at the
# floor, who reached the ceiling and of degenerate replies; the in-loop evaluation's score on the
# steps it runs.
PROGRESS_KEYS = {"reward_mean": "reward", "emotion_mean": "emotion", "failure_rate_reward": "reward<0.1",
                 "format_failure_rate": "format_fail", "user_left_rate": "user_left", "success_rate": "success",
                 "degenerate_rate": "degenerate", "tokens_per_second": "tok/s", "eval_score": "eval_score"}


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


def staleness_metrics(step: int, max_staleness: int, dialogues: Sequence[DialogueSequence]) -> dict[str, float]:
    """How many actor versions behind the update of step `step` the trainable dialogues' policy
    tokens were sampled, each token by the version that wrote its turn
    (DialogueSequence.policy_token_versions): the mean over policy tokens (`staleness_mean`), the
    most (`staleness_max`) and the share of policy tokens more than `max_staleness`
    (config.rollout.max_staleness) versions behind (`stale_token_frac`; the version schedule keeps
    every turn within the bound, so a share above 0 is a bug there, and the loop drops those
    dialogues). 0 over no policy token."""
    behind = [step - v for d in dialogues if d.trainable for v in d.policy_token_versions()]
    tokens = max(len(behind), 1)
    return {"staleness_mean": sum(behind) / tokens, "staleness_max": float(max(behind, default=0)),
            "stale_token_frac": sum(1 for v in behind if v > max_staleness) / tokens}


def check_finite(step: int, metrics: dict[str, float]) -> None:
    """Stop a run whose loss or norms went non-finite, naming the metrics."""
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    if bad:
        raise FloatingPointError(f"step {step}: non-finite training metrics {bad}")


def keep_steps_before(path: pathlib.Path, start: int) -> None:
    """Rewrite metrics.jsonl with only its complete lines of steps < `start` (see the module
    docstring); lines that do not parse (a torn line, or one an older version appended to a torn
    line) are dropped with a warning. Nothing is written when nothing is to drop."""
    if not path.exists():
        return
    kept, dropped, broken = [], [], []
    for number, raw in enumerate(raw_lines(path), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
            step = int(record["step"])
        except (UnicodeDecodeError, ValueError, KeyError, TypeError):
            broken.append(number)
            continue
        (kept if step < start else dropped).append(record)
    if dropped or broken or is_torn(path):
        atomic_write_jsonl(path, kept)
    if dropped:
        log.info("%s: dropped %d line(s) of steps >= %d (written after the checkpoint this run starts from)",
                 path, len(dropped), start)
    if broken:
        log.warning("%s: dropped unreadable line(s) %s (cut short by a crash)", path, broken)


class Writers:
    """metrics.jsonl (appended and flushed every step; lines of steps >= `start` dropped first),
    TensorBoard events, the progress bar (with the requests of the simulator client in flight and
    done) and, when `tracking` is on, Weights & Biases (metrics every step, a table of the batch's
    dialogues every `table_every` steps); process 0 writes, the others do nothing."""

    def __init__(self, workdir: pathlib.Path, *, start: int, total: int, progress: bool = True,
                 tracking_settings: tracking.TrackingSettings | None = None,
                 config: dict[str, Any] | None = None, table_every: int = 0):
        from tensorboardX import SummaryWriter
        from tqdm import tqdm

        self.metrics_path = workdir / "metrics.jsonl"
        self.writes = jax.process_index() == 0
        if self.writes:
            keep_steps_before(self.metrics_path, start)
        # purge_step: TensorBoard hides the events of steps >= start an earlier, killed run wrote.
        self.tb = None
        if self.writes:
            _catch_tensorboard_errors()
            self.tb = SummaryWriter(str(workdir / "tensorboard"), purge_step=start or None, max_queue=_TB_QUEUE)
        self.bar = tqdm(total=total, initial=start, disable=not progress or not self.writes, desc="train",
                        dynamic_ncols=True)
        self.tracker = (tracking.WandbLogger.create(tracking_settings, config)
                        if self.writes and tracking_settings is not None else None)
        self.table_every = table_every
        self._stop_showing_requests = inflight.show_requests(self.bar, "train")

    @contextlib.contextmanager
    def evaluating(self, step: int, profiles: int) -> Iterator[dict[str, float]]:
        """The in-loop evaluation of `step` shown as such: the bar's label says it runs (with the
        simulator's requests), a line after it gives its score and time; the metrics yielded get
        its `eval_seconds`."""
        label = f"step {step}: in-loop evaluation of {profiles} held-out profiles"
        self._show(label)
        timing: dict[str, float] = {}
        t0 = time.perf_counter()
        try:
            yield timing
        finally:
            timing["eval_seconds"] = time.perf_counter() - t0
            self._show("train")

    def _show(self, label: str) -> None:
        self._stop_showing_requests()
        self.bar.set_description_str(label)
        self._stop_showing_requests = inflight.show_requests(self.bar, label)

    def write(self, step: int, metrics: dict[str, float], dialogues: Sequence[DialogueSequence] = ()) -> None:
        if "eval_score" in metrics and not self.bar.disable:
            self.bar.write(f"step {step}: in-loop evaluation: held-out score {metrics['eval_score']:.1f} (mean final "
                           f"emotion, SAGE's rules), user left {metrics.get('eval_user_left_rate', 0):.2f}, "
                           f"{metrics.get('eval_seconds', 0):.0f} s")
        self.bar.update(1)
        self.bar.set_postfix({name: f"{metrics[k]:.3g}" for k, name in PROGRESS_KEYS.items() if k in metrics},
                             refresh=False)
        if not self.writes:
            return
        append_jsonl(self.metrics_path, {"step": step, **metrics})
        self._raise_tensorboard_error()
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.tb.add_scalar(tensorboard_tag(k), v, step)
        self.tb.flush()
        self._raise_tensorboard_error()
        if self.tracker is not None:
            self.tracker.log(step, metrics)
            if dialogues and self.table_every and (step + 1) % self.table_every == 0:
                self.tracker.log_transcripts(step, [{**d.to_record(), "reward": d.reward} for d in dialogues])

    def _raise_tensorboard_error(self) -> None:
        """The OSError tensorboardX's writer thread died of (see the module docstring), with the
        events directory named."""
        if _tensorboard_errors:
            e = _tensorboard_errors.pop(0)
            where = self.tb.logdir if self.tb is not None else "tensorboard"
            if isinstance(e, OSError):
                raise OSError(e.errno, e.strerror or str(e), e.filename or where) from e
            raise OSError(f"TensorBoard events in {where} could not be written: {type(e).__name__}: {e}") from e

    def close(self) -> None:
        self._stop_showing_requests()
        self.bar.close()
        if self.tb is not None:
            self.tb.close()
        if self.tracker is not None:
            self.tracker.close()


_TB_QUEUE = 10_000  # events tensorboardX may hold: many steps' scalars (a step logs about 60)
_tensorboard_errors: list[BaseException] = []  # what tensorboardX's writer threads died of, oldest first


def _catch_tensorboard_errors() -> None:
    """Route the exception that ends a tensorboardX writer thread to `_tensorboard_errors` instead of
    the console (threading.excepthook; other threads' exceptions go to the previous hook)."""
    if getattr(threading.excepthook, "_rlver_tensorboard", False):
        return
    from tensorboardX.event_file_writer import _EventLoggerThread

    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if isinstance(args.thread, _EventLoggerThread) and args.exc_value is not None:
            _tensorboard_errors.append(args.exc_value)
            return
        previous(args)

    hook._rlver_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook

"""The training program behind launch/train.py: rollouts -> PPO/GRPO updates -> logs, checkpoints.

`train(spec)` builds the run of a config's spec (rlver_jax.train.spec; rlver_jax.train.run.build_run)
and `train_run(run)` trains it, reading the run's typed settings only (`run.spec.loop`): it resumes
from the newest checkpoint in the work directory and runs `run.spec.loop.steps` steps. Each step takes
the next batch of dialogues from the async rollout buffer, updates the policy (and the critic),
publishes the new parameters to the sampler, and writes metrics (rlver_jax.train.metrics),
transcripts and checkpoints.
Every `eval_every` steps the current policy is scored on held-out profiles with the same
simulator code path, so reward hacking shows up as a gap between the two.

On many hosts every process runs this same loop. Rollouts are per process: each runs its own
dialogues of the step (`Run.own_dialogues`, whole GRPO groups) with its own simulator client, on
its own sampling copy of the policy (sharding.SamplingLayout). The finished dialogues are then
all-gathered (rlver_jax.parallel.hosts), so every process computes the same metrics and agrees on the
batch shapes, and each contributes only its own rows to the one global update. Process 0 writes
metrics, TensorBoard, transcripts and plots; every process saves its shards of the checkpoint.
A dialogue's randomness is a function of (seed, step, dialogue index), so the dialogues of a step
do not depend on the number of processes, devices or pipeline groups.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
import sys
import threading
import time
from collections.abc import Callable
from signal import SIGINT
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlver_jax.train import checkpoint
from rlver_jax.parallel import hosts, sharding
from rlver_jax.files import atomic_write_jsonl, read_jsonl
from rlver_jax.train.interrupts import StepGuard, TrainingInterrupted, signal_name
from rlver_jax.train.metrics import Writers, check_finite, staleness_metrics, throughput_metrics
from rlver_jax.plots import training_curves
from rlver_jax.rl import dynamic_sampling, offload, program as rl_program, train_state
from rlver_jax.rollout.buffer import RolloutBatch, RolloutBuffer
from rlver_jax.rollout.episodes import EpisodeRequest, EpisodeRunner
from rlver_jax.rollout.evaluation import play_profiles
from rlver_jax.rollout.jax_policy import JaxPolicy
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.rollout.versions import Resolve, VersionSchedule
from rlver_jax.text import degeneration
from rlver_jax.rollout.summary import (degenerate_replies, reencoded_turns, reference_metrics, rollout_metrics,
                                       summarize)
from rlver_jax.rollout.transcripts import discard_from as discard_transcripts
from rlver_jax.rollout.transcripts import transcript_path, write_transcripts
from rlver_jax.train.run import Run, build_run
from rlver_jax.train.spec import LoopSettings, RunSpec, resume_changes
from rlver_jax.simulator.agent import clipped_changes
from rlver_jax.simulator.factory import build_simulator
from rlver_jax.simulator.profiles import Profile

log = logging.getLogger(__name__)


def train(spec: RunSpec, *, progress: bool = True) -> dict[str, float]:
    """Build the run of `spec` (rlver_jax.train.run.build_run) and train it (`train_run`)."""
    return train_run(build_run(spec), progress=progress)


def train_run(run: Run, *, progress: bool = True) -> dict[str, float]:
    """Run (or resume) the training of `run`; returns the last step's metrics. Releases the work
    directory's lock (`run.lock`) when it ends.

    Ctrl-C or SIGTERM finishes the running step (interrupts.StepGuard; the in-loop evaluation is
    skipped, or abandoned when the signal comes during it), saves its checkpoint and raises
    interrupts.TrainingInterrupted, whose message says where the checkpoint is and how to resume; a
    failed checkpoint or transcript write stops the run at once; any other error leaves the last
    complete checkpoint and the finished steps' files as they are.
    """
    try:
        return _train(run, progress)
    finally:
        if run.lock is not None:
            run.lock.release()


def _train(run: Run, progress: bool) -> dict[str, float]:
    s = run.spec.loop
    manager = checkpoint.make_manager(run.storage.checkpoints, save_every=s.save_every, keep=s.keep,
                                      async_save=s.async_save)
    guard = StepGuard(s.stop_within_s, on_expiry=lambda signum: _expired(signum, manager, s, run.lock),
                      processes=jax.process_count(), agree=_any_process)
    state, start, metrics = None, 0, {}
    buffer = writers = None
    norms: dict[str, float] = {}
    versions: dict[int, Any] = {}
    record = _record(s.seed, run.lora_base, run.spec.resume_record)
    try:
        state, start, meta, previous = _resume(manager, run.state, s, run.lora_base)
        # The actor versions the next max_staleness batches are sampled with (`_sampling_versions`).
        versions = _sampling_versions(run, start, previous)
        if meta is not None:
            _log_changes(run, meta, start)
        if start >= s.steps:
            log.info("nothing left to train: %s holds step %d of config.train.steps=%d; to train further raise "
                     "--config.train.steps and add --config.checkpoint.allow_changes=train.steps", manager.directory,
                     start, s.steps)
            return {}
        norms = param_norms(state)  # the baseline of the first step's growth check (parts on the devices)
        lowest_degenerate = None  # the run's lowest degenerate_rate so far (_check_degeneration)
        if start and jax.process_index() == 0:
            run.storage.pull("metrics.jsonl")  # a gs:// run resumed elsewhere: the curves so far
        # A host copy of the run key (replicated; every update donates state.rng).
        rng = sharding.replicated_value(state.rng)
        buffer = _rollout_buffer(run, rng, start)
        writers = Writers(run.workdir, start=start, total=s.steps, progress=progress, tracking_settings=run.tracking,
                          config=run.spec.record, table_every=s.eval_every)
        if jax.process_index() == 0:
            discard_transcripts(run.workdir / "transcripts", start)  # steps >= start run again
        for version, actor in versions.items():  # this process's sampling copies (LoRA: merged into the base)
            buffer.publish(version, run.sampling_layout.copy(run.update.actor_params(state.replace(actor=actor),
                                                                                      run.frozen)))
        sampler = run.sampling_layout.copy(run.update.actor_params(state, run.frozen))
        buffer.publish(start, sampler)
        for step in range(start, s.steps):
            t0 = time.perf_counter()
            batch = buffer.get(until=lambda: guard.stopping)
            wait_s = time.perf_counter() - t0
            checkpoint.check(manager)  # the last save is written (or its failure stops the run) before an update
            if (batch is None or guard.processes > 1) and guard.stop_agreed():  # signalled while waiting
                raise KeyboardInterrupt
            guard.begin_step(step)  # from here to the checkpoint, a signal waits for the step to end
            if s.max_staleness:  # the actor of this version, for the batches sampled with it after a resume
                versions = {**{v: a for v, a in versions.items() if v > step - s.max_staleness},
                            step: jax.tree.map(jnp.copy, state.actor)}
            else:  # the sampler idles until the next publish: its memory goes to the update
                jax.tree.map(lambda x: x.delete(), sampler)
            state, dialogues, advantages, metrics = _update(run, step, state, batch, wait_s)
            norms = _check_growth(step, norms, metrics, s, manager)
            sampler = run.sampling_layout.copy(run.update.actor_params(state, run.frozen))
            buffer.publish(step + 1, sampler)
            if s.transcripts and jax.process_index() == 0:
                write_transcripts(run.workdir / "transcripts", step, dialogues, advantages=advantages)
            if s.eval_every and run.eval_profiles and (step + 1) % s.eval_every == 0:
                with writers.evaluating(step, len(run.eval_profiles[:s.eval_max_profiles or None])) as timing:
                    evaluated = _evaluate_unless_stopping(run, sampler, step, train_state.step_keys(rng, step).eval,
                                                          guard)
                metrics.update(evaluated, **(timing if evaluated else {}))
            writers.write(step, metrics, dialogues)
            lowest_degenerate = _check_degeneration(step, lowest_degenerate, metrics, s)
            checkpoint.save(manager, step + 1, state, _meta(step + 1, record, norms, versions),
                            force=step + 1 == s.steps, sampling=_sampling_item(versions))
            if jax.process_index() == 0:
                run.storage.push()
            guard.end_step()
    except KeyboardInterrupt:
        raise _interrupted(manager, state, guard.step, {**record, "param_norms": norms,
                                                        **({"sampling_versions": sorted(versions)} if versions else {})},
                           s.workdir, sampling=_sampling_item(versions), exit_status=guard.exit_status,
                           signal=guard.signal) from None
    finally:
        guard.close()
        _shut_down(buffer, manager, writers)
        guard.cancel_clock()
    if jax.process_index() == 0 and writers.metrics_path.exists():
        training_curves(writers.metrics_path, run.workdir / "reward.png", title=pathlib.PurePosixPath(s.workdir).name)
        run.storage.push()
    return metrics


def _any_process(flag: bool) -> bool:
    """Whether any process's `flag` is set (a collective of every process)."""
    return any(hosts.allgather_json(bool(flag)))


def _expired(signum: int, manager, s, lock) -> None:
    """The clock after a signal ran out (interrupts.StepGuard): say what is kept and free the lock;
    the process then exits with the signal's status."""
    try:
        steps = checkpoint.steps_in(manager.directory)
    except Exception:  # noqa: BLE001 - the message must come out whatever the disk does
        steps = []
    kept = f"the checkpoint of step {steps[-1]} is in {manager.directory}" if steps else "no checkpoint was saved"
    print(f"{pathlib.Path(sys.argv[0]).name}: {signal_name(signum)}: stopped {s.stop_within_s:g} s after the signal "
          f"(config.checkpoint.stop_within_s) before the running step could be finished and saved; {kept}. Rerun "
          f"the same command to resume (config.workdir={s.workdir}).", file=sys.stderr, flush=True)
    if lock is not None:
        lock.release()


def _evaluate_unless_stopping(run: Run, sampler: Any, step: int, key: jax.Array, guard: StepGuard) -> dict[str, float]:
    """The in-loop evaluation of `step`, unless a signal came (it is skipped: the checkpoint must be
    written in bounded time); a signal during it abandons it (one process: the update is complete,
    so the step is saved without its evaluation)."""
    if guard.stopping:
        log.warning("step %d: the in-loop evaluation is skipped (stopping)", step)
        return {}
    if guard.processes > 1:  # every process must stop at the same point: it cannot be cut short
        return evaluate(run, sampler, step, key)
    try:
        with guard.interruptible():
            return evaluate(run, sampler, step, key)
    except KeyboardInterrupt:
        if not guard.stopping:
            raise
        log.warning("step %d: the in-loop evaluation was abandoned (%s)", step, signal_name(guard.signal))
        return {}


def _update(run: Run, step: int, state: train_state.TrainState, batch: RolloutBatch, wait_s: float
            ) -> tuple[train_state.TrainState, list[DialogueSequence], list[float | None], dict[str, float]]:
    """Step `step`'s update on `batch` (this process's dialogues of it; `wait_s`: how long the loop
    waited for it): the new state, every process's dialogues, their advantages as the trainer gave
    them (`_advantages`) and the step's metrics so far. Dialogues beyond the staleness bound are
    left out (`_drop_stale`); the staleness metrics count their tokens."""
    dialogues = list(batch.sequences)  # every process's, token views included
    if jax.process_count() > 1:
        dialogues = [DialogueSequence(**fields) for fields in hosts.allgather_placed(
            [dataclasses.asdict(s) for s in dialogues], run.collation.dialogue_process)]
    staleness = staleness_metrics(step, run.spec.loop.max_staleness, dialogues)
    dropped = _drop_stale(step, run.spec.loop.max_staleness, dialogues)
    _check_trainable(step, dialogues, run.workdir / "transcripts")
    train_batch, policy_tokens = run.collation.collate(dialogues, share=len(batch.sequences), step=step)
    t1 = time.perf_counter()
    state, update_metrics, advantages = rl_program.train_on_batch(run.update, state, train_batch, run.frozen,
                                                               policy_tokens)
    update_s = time.perf_counter() - t1
    check_finite(step, update_metrics)
    tokens = float(sum(len(s.tokens) for s in dialogues if s.trainable))
    return state, dialogues, _advantages(advantages, dialogues), {**rollout_metrics(dialogues),
                              **reference_metrics(dialogues), **update_metrics,
                              **throughput_metrics(tokens, batch.seconds, update_s, wait_s),
                              "policy_lag": float(step - batch.version), **staleness,
                              "stale_dialogues_dropped": float(dropped),
                              "kv_cache_reencodes": float(reencoded_turns(dialogues)),
                              "simulator_clipped_changes": float(clipped_changes(d.simulator_state for d in dialogues))}


def _drop_stale(step: int, max_staleness: int, dialogues: list[DialogueSequence]) -> int:
    """Mark `stale` (left out of the update, never trained silently) every trainable dialogue with
    a turn more than `max_staleness` versions behind step `step`, with a warning; how many. The
    version schedule (rollout.versions) keeps every turn of a batch within the bound, so in a run
    this finds none and nothing needs replacing: a dialogue it finds is a bug upstream, dropped
    rather than trained."""
    stale = [d for d in dialogues if d.trainable and min(d.turn_versions()) < step - max_staleness]
    for d in stale:
        d.stale = True
    if stale:
        log.warning("step %d: %d dialogue(s) hold turns more than max_staleness=%d versions behind (oldest: version "
                    "%d); left out of the update (stale_dialogues_dropped)", step, len(stale), max_staleness,
                    min(min(d.turn_versions()) for d in stale))
    return len(stale)


def _advantages(advantages: np.ndarray, dialogues: list[DialogueSequence]) -> list[float | None]:
    """Each dialogue's advantage as the trainer gave it (`advantages` by the batch's dialogue ids:
    a dialogue's index in the step), None for one left out of training."""
    return [float(advantages[d]) if s.trainable else None for d, s in enumerate(dialogues)]


def _interrupted(manager, state: train_state.TrainState | None, torn_step: int | None, record: dict,
                 workdir: str, *, sampling: Any = None, exit_status: int = 130,
                 signal: int | None = None) -> TrainingInterrupted:
    """After Ctrl-C or SIGTERM (`signal`): save the state of the last complete step (with the run's
    checkpoint `record`, `_record`, and the actor versions of `sampling`) unless a checkpoint of it
    exists (or it is torn, or there is no state yet: then the last checkpoint is kept); the error
    that says so (`workdir`: config.workdir, to resume; `exit_status`: the process's)."""
    if torn_step is None and state is not None:
        step = int(state.step)  # every step up to here is complete, its metrics written
        if step > 0 and checkpoint.latest_step(manager) != step:
            log.warning("%s: saving the checkpoint of step %d", signal_name(signal), step)
            checkpoint.save(manager, step, state, {"step": step, **record}, force=True, sampling=sampling)
        checkpoint.wait(manager)
    saved = checkpoint.latest_step(manager)
    lost = f"step {torn_step} was cut short and is not kept; " if torn_step is not None else ""
    where = (f"the checkpoint of step {saved} is in {manager.directory}" if saved is not None
             else "no step was completed, nothing is saved")
    what = "interrupted" if signal in (None, SIGINT) else f"stopped by {signal_name(signal)}"
    return TrainingInterrupted(f"{what}: {lost}{where}. Rerun the same command to resume "
                               f"(config.workdir={workdir}).", exit_status)


def _shut_down(buffer: RolloutBuffer | None, manager, writers: Writers | None) -> None:
    """Stop the producer, finish pending checkpoint writes, close the writers. Every part runs; when
    the loop failed (a full disk, say), a failure here is logged so that the loop's error is the
    one raised, and the checkpoint manager gets `_CLOSE_AFTER_ERROR_S` to finish (a failed save can
    leave orbax waiting minutes for a signal that never comes)."""
    failing = sys.exc_info()[0] is not None
    save_failed = isinstance(sys.exc_info()[1], checkpoint.CheckpointWriteError)  # said once: not waited for again
    first: BaseException | None = None
    parts = [buffer.close if buffer is not None else None,
             lambda: _bounded(lambda: _close_manager(manager, wait=not save_failed),
                              _CLOSE_AFTER_ERROR_S if failing else None),
             writers.close if writers is not None else None]
    for close in parts:
        if close is None:
            continue
        try:
            close()
        except Exception as e:  # noqa: BLE001 - each part must get its turn
            if failing:
                log.warning("while stopping after an error: %s", e)
            first = first or e
    if first is not None and not failing:
        raise first


_CLOSE_AFTER_ERROR_S = 30.0


def _close_manager(manager, wait: bool = True) -> None:
    """Wait for pending saves, then close the manager, even when the wait fails (its error is
    raised). Without `wait` (a save failed and was reported) the manager is closed and the same
    failure, which closing raises again, is not reported twice."""
    if not wait:
        try:
            manager.close()
        except Exception as e:  # noqa: BLE001 - the failed save, once more
            log.debug("closing the checkpoint manager after a failed save: %s", e)
        return
    try:
        checkpoint.wait(manager)
    finally:
        manager.close()


def _bounded(work: Callable[[], Any], timeout_s: float | None) -> None:
    """Run `work`; with `timeout_s`, in a daemon thread given that long (then left behind, logged)."""
    if timeout_s is None:
        work()
        return
    errors: list[BaseException] = []

    def run():
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors.append(e)

    thread = threading.Thread(target=run, name="close-checkpoints", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        log.warning("the checkpoint manager did not close within %g s; left behind", timeout_s)
    elif errors:
        raise errors[0]


def _resume(manager, initial: train_state.TrainState, s: LoopSettings, lora_base: dict | None
            ) -> tuple[train_state.TrainState, int, dict | None, dict[int, Any]]:
    """(state, its step, its checkpoint's record or None, the actor versions the checkpoint holds
    for sampling): the newest usable checkpoint (`s.resume`; `s.read_attempts` reads each, weights
    that are not finite or differ from the record's norms are not usable), or the run's `initial`
    state at step 0. A LoRA checkpoint must hold adapters of the run's `lora_base`."""
    restored = (checkpoint.restore_newest_readable(manager, initial, attempts=s.read_attempts, verify=_verify)
                if s.resume else None)
    if restored is None:
        return initial, 0, None, {}
    state, meta = restored
    if meta.get("lora_base") != lora_base:
        raise ValueError(f"{manager.directory} holds LoRA adapters of the base {meta.get('lora_base')}, but the "
                         f"config names {lora_base} (config.model.path, config.model.preset, config.seed, "
                         "config.lora): train with the checkpoint's, or start a new config.workdir")
    step = int(meta["step"])
    versions: dict[int, Any] = {}
    if s.max_staleness and meta.get("sampling_versions"):
        names = {int(v): f"version_{v}" for v in meta["sampling_versions"]}
        item = checkpoint.restore_item(manager, step, "sampling", {n: initial.actor for n in names.values()})
        versions = {v: item[n] for v, n in names.items()} if item is not None else {}
    log.info("resumed from %s at step %d", manager.directory, step)
    return state, step, meta, versions


def _sampling_versions(run: Run, start: int, previous: dict[int, Any]) -> dict[int, Any]:
    """The actor versions (version -> actor in the train state's layout) the first max_staleness
    batches from `start` on are sampled with besides the state's own: versions start - max_staleness
    .. start - 1, from the checkpoint (`previous`). A checkpoint without them (written with
    max_staleness 0, or by an older version) resumes with the newest version: warned, not exact."""
    s = run.spec.loop
    wanted = [v for v in range(start - s.max_staleness, start) if v >= 0]
    if wanted and not all(v in previous for v in wanted):
        log.warning("the checkpoint of step %d holds no actor of versions %s: the next %d batch(es) are sampled "
                    "with the newest parameters, not as the uninterrupted run sampled them", start, wanted,
                    len(wanted))
        return {}
    return {v: previous[v] for v in wanted}


def _sampling_item(versions: dict[int, Any]) -> dict[str, Any] | None:
    """The checkpoint item holding `versions` (None when there are none)."""
    return {f"version_{v}": actor for v, actor in versions.items()} or None


def _record(seed: int, lora_base: dict | None, fields: dict | None = None) -> dict:
    """What a checkpoint's JSON record holds besides its step: the seed, (LoRA) the base its
    adapters belong to, and the config fields a resume compares (`fields`: spec.resume_record)."""
    return {"seed": seed, **({"lora_base": lora_base} if lora_base else {}), **({"run": fields} if fields else {})}


def _meta(step: int, record: dict, norms: dict[str, float], versions: dict[int, Any]) -> dict:
    """The record of the checkpoint of `step`: `record`, the parameter norms of its models (checked
    when it is read back) and the actor versions of its `sampling` item."""
    return {"step": step, **record, "param_norms": norms,
            **({"sampling_versions": sorted(versions)} if versions else {})}


_global_norm = jax.jit(optax.global_norm)


def param_norms(state: train_state.TrainState) -> dict[str, float]:
    """The global norm of each model's trainable parameters ("actor", "critic"), for those in
    device memory (offloaded parts are left out: nothing is computed in host memory)."""
    out = {}
    for name in ("actor", "critic"):
        tree = getattr(state, name)
        leaves = jax.tree.leaves(tree) if tree is not None else []
        if not leaves or any(getattr(x.sharding, "memory_kind", None) == offload.HOST_MEMORY for x in leaves):
            continue
        out[name] = float(sharding.replicated_value(_global_norm(tree)))
    return out


def _verify(state: train_state.TrainState, meta: dict) -> str | None:
    """Why a restored checkpoint is not usable (its weights are not finite, or their norms are not
    those its record holds), else None."""
    norms = param_norms(state)
    bad = {k: v for k, v in norms.items() if not math.isfinite(v)}
    if bad:
        return f"its weights are not finite (parameter norms {bad})"
    recorded = meta.get("param_norms") or {}
    off = {k: (recorded[k], v) for k, v in norms.items()
           if k in recorded and not math.isclose(recorded[k], v, rel_tol=1e-3, abs_tol=1e-6)}
    if off:
        return "its weights differ from its record (" + ", ".join(f"{k} norm {a:.6g} recorded, {b:.6g} read"
                                                                  for k, (a, b) in off.items()) + ")"
    return None


class DivergedError(FloatingPointError):
    """A step's update grew a parameter norm beyond config.train.max_param_norm_growth."""


def _check_growth(step: int, before: dict[str, float], metrics: dict[str, float], s: LoopSettings,
                  manager) -> dict[str, float]:
    """The parameter norms after step `step` (from its metrics); DivergedError, before anything of
    the step is written, when one grew by more than `s.max_param_norm_growth` from `before`."""
    after = {name: metrics[f"{name}_param_norm"] for name in ("actor", "critic") if f"{name}_param_norm" in metrics}
    growth = s.max_param_norm_growth
    over = {k: (before[k], v) for k, v in after.items()
            if growth and before.get(k, 0.0) > 0 and v > growth * before[k]}
    if over:
        saved = checkpoint.latest_step(manager)
        kept = f"the checkpoint of step {saved} in {manager.directory}" if saved is not None else "no checkpoint"
        shown = ", ".join(f"the {k}'s from {a:.4g} to {b:.4g} (x{b / a:.3g})" for k, (a, b) in over.items())
        names = ",".join(f"optim.{k}.lr" for k in over)
        raise DivergedError(
            f"step {step}: the update diverged: it grew the parameter norm {shown}, more than "
            f"config.train.max_param_norm_growth={growth:g} allows; the step is not saved (kept: {kept}). Lower the "
            f"learning rate and rerun with --config.checkpoint.allow_changes={names}")
    return {**before, **after}


class DegenerateRepliesError(RuntimeError):
    """A step's share of degenerate replies rose beyond config.train.degenerate_alarm (action "stop")."""


def _check_degeneration(step: int, lowest: float | None, metrics: dict[str, float], s: LoopSettings) -> float:
    """The lowest degenerate_rate of the run up to step `step`; a warning, or with action "stop" a
    DegenerateRepliesError before the step is saved, when this step's rate rose more than
    `s.degenerate_alarm` above the lowest before it."""
    rate = metrics["degenerate_rate"]
    if s.degenerate_alarm and lowest is not None and rate - lowest > s.degenerate_alarm:
        message = (f"step {step}: {degeneration.describe(metrics)} of the policy's replies are degenerate, up from "
                   f"{lowest:.0%} earlier in the run: more than config.train.degenerate_alarm={s.degenerate_alarm:g}; "
                   f"read {s.workdir}/transcripts")
        if s.degenerate_alarm_action == "stop":
            raise DegenerateRepliesError(f"{message}. The step is not saved; lower the learning rate or fix the "
                                         "prompts, then resume")
        log.warning("%s", message)
    return rate if lowest is None else min(lowest, rate)


def _log_changes(run: Run, meta: dict, start: int) -> None:
    """Log the config fields this resume changes (allowed by config.checkpoint.allow_changes; a
    change it may not make was refused before anything was written, rlver_jax.train.run.claim) and
    (process 0) record them in WORKDIR/changes.jsonl at step `start`, each step's changes once."""
    if "run" not in meta:
        return
    changes = resume_changes(meta["run"], run.spec, f"the checkpoint of step {start} in {run.storage.checkpoints}")
    for field, before, after in changes:
        log.warning("step %d: %s changed from %r to %r (config.checkpoint.allow_changes)", start, field, before, after)
    if jax.process_index() == 0:
        path = run.workdir / CHANGES
        before = read_jsonl(path) if path.exists() else []
        kept = [r for r in before if r.get("step", 0) < start]  # a run resumed again at `start`: once
        if changes or len(kept) != len(before):
            atomic_write_jsonl(path, kept + [{"step": start, "field": f, "before": b, "after": a}
                                             for f, b, a in changes])


CHANGES = "changes.jsonl"


def _rollout_buffer(run: Run, rng: np.ndarray, start: int) -> RolloutBuffer:
    """The producer of batch after batch from `start` on: batch i holds this process's dialogues
    of `profiles_for_step(i)` (`run.own_dialogues`; dialogue d is sample d % n of profile d // n),
    dialogue d sampled from fold_in(rollout key of step i, d), each turn by the version of the
    batch's schedule (rollout.versions), dynamic sampling's refills too."""
    simulator = build_simulator(run.spec.simulator)
    policy = JaxPolicy(run.update.actor_cfg, run.chat, run.spec.sampling, None, train_state.step_keys(rng, start).rollout)
    runner = EpisodeRunner(policy, simulator, run.chat, run.spec.rollout, run.spec.rl.reward_mode)
    k, n = run.spec.loop.profiles_per_step, run.spec.loop.n

    async def make_batch(index: int, versions: VersionSchedule, resolve: Resolve) -> list[DialogueSequence]:
        policy.follow(resolve, rng=train_state.step_keys(rng, index).rollout)
        profiles = profiles_for_step(run.train_profiles, index, k, run.spec.loop.seed)
        requests = [EpisodeRequest(profiles[d // n], int(d // n), index=int(d)) for d in run.own_dialogues]
        dialogues = await runner.run(requests, versions)  # DAPO: groups without signal sampled again (rl.dynamic_sampling)
        return await dynamic_sampling.refill_step(run.spec.rl, lambda again: runner.run(again, versions), requests,
                                                  dialogues, run.train_profiles, run.spec.loop.seed, index, k * n)

    return RolloutBuffer(make_batch, max_staleness=run.spec.loop.max_staleness,
                         partial=run.spec.loop.partial_rollouts, start_index=start, finalize=simulator.aclose)


class AllDialoguesFailedError(RuntimeError):
    """No dialogue of a step can be trained on (every one ended as simulator_error, or had no
    policy turn); the step's transcripts are written first."""


def _check_trainable(step: int, dialogues: list[DialogueSequence], transcripts: pathlib.Path) -> None:
    """Raise AllDialoguesFailedError, after writing them to `transcripts`, when no dialogue of step
    `step` can be trained on."""
    if any(s.trainable for s in dialogues):
        return
    path = transcript_path(transcripts, step)
    if jax.process_index() == 0:
        write_transcripts(path.parent, step, dialogues)
    failed = [s for s in dialogues if s.simulator_error]
    errors = [s.simulator_state.get("error") for s in failed if s.simulator_state.get("error")]
    stale = sum(s.stale for s in dialogues)
    cause = (f"{len(failed)} of {len(dialogues)} ended as simulator_error"
             + (f" (last: {errors[-1]})" if errors else "")) if failed else (
        f"{stale} beyond the staleness bound, the rest without a policy turn" if stale else "none had a policy turn")
    raise AllDialoguesFailedError(f"step {step}: no dialogue can be trained on: {cause}. The dialogues "
                                  f"are in {path}")


def profiles_for_step(profiles: list[Profile], step: int, k: int, seed: int) -> list[Profile]:
    """The k profiles of train step `step`: consecutive slices of per-epoch shuffles, a pure
    function of (seed, step), so resuming at a step replays exactly the same data."""
    n = len(profiles)
    out = []
    for pos in range(step * k, step * k + k):
        epoch, i = divmod(pos, n)
        order = np.random.default_rng([seed, epoch]).permutation(n)
        out.append(profiles[order[i]])
    return out


def evaluate(run: Run, params: Any, step: int, key: jax.Array) -> dict[str, float]:
    """Score the current policy (`params`: this process's sampling copy) on held-out profiles as
    the Sentient benchmark does (run.spec.eval: the training simulator's backend under SAGE's rules,
    the benchmark's policy sampling), profile i sampled from fold_in(key, i) (`key`: the step's
    evaluation key); eval_score is comparable with launch/eval.py's. Each process plays a
    contiguous share of the profiles; the results are combined (rollout.evaluation)."""
    profiles = run.eval_profiles
    if run.spec.loop.eval_max_profiles:
        profiles = profiles[:run.spec.loop.eval_max_profiles]
    policy = JaxPolicy(run.update.actor_cfg, run.chat, run.spec.eval.sampling, params, key)
    seqs = play_profiles(policy, run.chat, run.spec.eval.simulator, run.spec.eval.rollout, list(enumerate(profiles)),
                         version=step, transcripts_dir=run.workdir / "transcripts")
    s = summarize(seqs)
    n = max(s.scored, 1)
    return {"eval_score": s.score, "eval_success_rate": s.success / n, "eval_user_left_rate": s.failure / n,
            "eval_mean_turns": s.scored_turns, "eval_simulator_errors": float(s.simulator_errors),
            "eval_no_policy_turn": float(s.no_policy_turn),
            "eval_kv_cache_reencodes": float(reencoded_turns(seqs)),
            "eval_degenerate_rate": degenerate_replies(seqs)["degenerate_rate"]}

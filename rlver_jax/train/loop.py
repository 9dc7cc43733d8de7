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
import pathlib
import sys
import time
from typing import Any

import jax
import numpy as np

from rlver_jax.train import checkpoint
from rlver_jax.parallel import hosts, sharding
from rlver_jax.train.interrupts import StepGuard, TrainingInterrupted
from rlver_jax.train.metrics import Writers, check_finite, throughput_metrics
from rlver_jax.plots import training_curves
from rlver_jax.rl import dynamic_sampling, program as rl_program, train_state
from rlver_jax.rollout.buffer import RolloutBatch, RolloutBuffer
from rlver_jax.rollout.episodes import EpisodeRequest, EpisodeRunner
from rlver_jax.rollout.evaluation import play_profiles
from rlver_jax.rollout.jax_policy import JaxPolicy
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.rollout.summary import reencoded_turns, reference_metrics, rollout_metrics, summarize
from rlver_jax.rollout.transcripts import discard_from as discard_transcripts
from rlver_jax.rollout.transcripts import transcript_path, write_transcripts
from rlver_jax.train.run import Run, build_run
from rlver_jax.train.spec import RunSpec
from rlver_jax.simulator.agent import clipped_changes
from rlver_jax.simulator.factory import build_simulator
from rlver_jax.simulator.profiles import Profile

log = logging.getLogger(__name__)


def train(spec: RunSpec, *, progress: bool = True) -> dict[str, float]:
    """Build the run of `spec` (rlver_jax.train.run.build_run) and train it (`train_run`)."""
    return train_run(build_run(spec), progress=progress)


def train_run(run: Run, *, progress: bool = True) -> dict[str, float]:
    """Run (or resume) the training of `run`; returns the last step's metrics.

    Ctrl-C finishes the running step (interrupts.StepGuard), saves its checkpoint and raises
    interrupts.TrainingInterrupted, whose message says where the checkpoint is and how to resume;
    any other error leaves the last complete checkpoint and the finished steps' files as they are.
    """
    s = run.spec.loop
    manager = checkpoint.make_manager(run.storage.checkpoints, save_every=s.save_every, keep=s.keep,
                                      async_save=s.async_save)
    state, start = _resume(manager, run.state, s.resume, run.lora_base)
    record = _record(s.seed, run.lora_base)
    if start >= s.steps:
        manager.close()
        log.info("nothing left to train: %s holds step %d of config.train.steps=%d; raise --config.train.steps "
                 "to train further", manager.directory, start, s.steps)
        return {}
    if start and jax.process_index() == 0:
        run.storage.pull("metrics.jsonl")  # a gs:// run resumed elsewhere: the curves so far
    # A host copy of the run key (replicated; every update donates state.rng).
    rng = sharding.replicated_value(state.rng)
    buffer = _rollout_buffer(run, rng, start)
    writers = Writers(run.workdir, start=start, total=s.steps, progress=progress, tracking_settings=run.tracking,
                      config=run.spec.record, table_every=s.eval_every)
    if jax.process_index() == 0:
        discard_transcripts(run.workdir / "transcripts", start)  # steps >= start run again
    # this process's copy, on its own devices (LoRA: the adapters merged into the base)
    sampler = run.sampling_layout.copy(run.update.actor_params(state, run.frozen))
    buffer.publish(start, sampler)
    metrics: dict[str, float] = {}
    guard = StepGuard()
    try:
        for step in range(start, s.steps):
            t0 = time.perf_counter()
            batch = buffer.get()
            wait_s = time.perf_counter() - t0
            guard.begin_step(step)  # from here to the checkpoint, Ctrl-C waits for the step to end
            if s.max_staleness == 0:  # the sampler idles until the next publish:
                jax.tree.map(lambda x: x.delete(), sampler)  # its memory goes to the update
            state, dialogues, advantages, metrics = _update(run, step, state, batch, wait_s)
            sampler = run.sampling_layout.copy(run.update.actor_params(state, run.frozen))
            buffer.publish(step + 1, sampler)
            if s.transcripts and jax.process_index() == 0:
                write_transcripts(run.workdir / "transcripts", step, dialogues, advantages=advantages)
            if s.eval_every and run.eval_profiles and (step + 1) % s.eval_every == 0:
                metrics.update(evaluate(run, sampler, step, train_state.step_keys(rng, step).eval))
            writers.write(step, metrics, dialogues)
            checkpoint.save(manager, step + 1, state, {"step": step + 1, **record}, force=step + 1 == s.steps)
            if jax.process_index() == 0:
                run.storage.push()
            guard.end_step()
    except KeyboardInterrupt:
        raise _interrupted(manager, state, guard.step, record, s.workdir) from None
    finally:
        guard.close()
        _shut_down(buffer, manager, writers)
    if jax.process_index() == 0 and writers.metrics_path.exists():
        training_curves(writers.metrics_path, run.workdir / "reward.png", title=pathlib.PurePosixPath(s.workdir).name)
        run.storage.push()
    return metrics


def _update(run: Run, step: int, state: train_state.TrainState, batch: RolloutBatch, wait_s: float
            ) -> tuple[train_state.TrainState, list[DialogueSequence], list[float | None], dict[str, float]]:
    """Step `step`'s update on `batch` (this process's dialogues of it; `wait_s`: how long the loop
    waited for it): the new state, every process's dialogues, their advantages as the trainer gave
    them (`_advantages`) and the step's metrics so far."""
    if batch.version < step - run.spec.loop.max_staleness:  # the buffer guarantees this
        raise AssertionError(f"batch of version {batch.version} at step {step}")
    dialogues = list(batch.sequences)  # every process's, token views included
    if jax.process_count() > 1:
        dialogues = [DialogueSequence(**fields) for fields in hosts.allgather_placed(
            [dataclasses.asdict(s) for s in dialogues], run.collation.dialogue_process)]
    _check_trainable(step, dialogues, run.workdir / "transcripts")
    train_batch, policy_tokens = run.collation.collate(dialogues, share=len(batch.sequences))
    t1 = time.perf_counter()
    state, update_metrics, advantages = rl_program.train_on_batch(run.update, state, train_batch, run.frozen,
                                                               policy_tokens)
    update_s = time.perf_counter() - t1
    check_finite(step, update_metrics)
    tokens = float(sum(len(s.tokens) for s in dialogues if s.trainable))
    return state, dialogues, _advantages(advantages, dialogues), {**rollout_metrics(dialogues),
                              **reference_metrics(dialogues), **update_metrics,
                              **throughput_metrics(tokens, batch.seconds, update_s, wait_s),
                              "policy_lag": float(step - batch.version),
                              "kv_cache_reencodes": float(reencoded_turns(dialogues)),
                              "simulator_clipped_changes": float(clipped_changes(d.simulator_state for d in dialogues))}


def _advantages(advantages: np.ndarray, dialogues: list[DialogueSequence]) -> list[float | None]:
    """Each dialogue's advantage as the trainer gave it (`advantages` by the batch's dialogue ids:
    a dialogue's index in the step), None for one left out of training."""
    return [float(advantages[d]) if s.trainable else None for d, s in enumerate(dialogues)]


def _interrupted(manager, state: train_state.TrainState, torn_step: int | None, record: dict,
                 workdir: str) -> TrainingInterrupted:
    """After Ctrl-C: save the state of the last complete step (with the run's checkpoint `record`,
    `_record`) unless a checkpoint of it exists (or it is torn: then the last checkpoint is kept);
    the error that says so (`workdir`: config.workdir, to resume)."""
    if torn_step is None:
        step = int(state.step)  # every step up to here is complete, its metrics written
        if step > 0 and checkpoint.latest_step(manager) != step:
            log.warning("interrupted: saving the checkpoint of step %d", step)
            checkpoint.save(manager, step, state, {"step": step, **record}, force=True)
        checkpoint.wait(manager)
    saved = checkpoint.latest_step(manager)
    lost = f"step {torn_step} was cut short and is not kept; " if torn_step is not None else ""
    where = (f"the checkpoint of step {saved} is in {manager.directory}" if saved is not None
             else "no step was completed, nothing is saved")
    return TrainingInterrupted(f"interrupted: {lost}{where}. Rerun the same command to resume "
                               f"(config.workdir={workdir}).")


def _shut_down(buffer: RolloutBuffer, manager, writers: Writers) -> None:
    """Stop the producer, finish pending checkpoint writes, close the writers. Every part runs; when
    the loop failed (a full disk, say), a failure here is logged so that the loop's error is the
    one raised."""
    failing = sys.exc_info()[0] is not None
    first: BaseException | None = None
    for close in (buffer.close, lambda: checkpoint.wait(manager), manager.close, writers.close):
        try:
            close()
        except Exception as e:  # noqa: BLE001 - each part must get its turn
            if failing:
                log.warning("while stopping after an error: %s", e)
            first = first or e
    if first is not None and not failing:
        raise first


def _resume(manager, initial: train_state.TrainState, resume: bool, lora_base: dict | None
            ) -> tuple[train_state.TrainState, int]:
    """The state to start from and its step: the newest readable checkpoint (with `resume`), or the
    run's `initial` state at step 0. A LoRA checkpoint must hold adapters of the run's `lora_base`."""
    restored = checkpoint.restore_newest_readable(manager, initial) if resume else None
    if restored is None:
        return initial, 0
    state, meta = restored
    if meta.get("lora_base") != lora_base:
        raise ValueError(f"{manager.directory} holds LoRA adapters of the base {meta.get('lora_base')}, but the "
                         f"config names {lora_base} (config.model.path, config.model.preset, config.seed, "
                         "config.lora): train with the checkpoint's, or start a new config.workdir")
    log.info("resumed from %s at step %d", manager.directory, int(meta["step"]))
    return state, int(meta["step"])


def _record(seed: int, lora_base: dict | None) -> dict:
    """What a checkpoint's JSON record holds besides its step: the seed and (LoRA) the base its
    adapters belong to."""
    return {"seed": seed, **({"lora_base": lora_base} if lora_base else {})}


def _rollout_buffer(run: Run, rng: np.ndarray, start: int) -> RolloutBuffer:
    """The producer of batch after batch from `start` on: batch i holds this process's dialogues
    of `profiles_for_step(i)` (`run.own_dialogues`; dialogue d is sample d % n of profile d // n),
    dialogue d sampled from fold_in(rollout key of step i, d)."""
    simulator = build_simulator(run.spec.simulator)
    policy = JaxPolicy(run.update.actor_cfg, run.chat, run.spec.sampling, None, train_state.step_keys(rng, start).rollout)
    runner = EpisodeRunner(policy, simulator, run.chat, run.spec.rollout)
    k, n = run.spec.loop.profiles_per_step, run.spec.loop.n

    async def make_batch(index: int, version: int, params: Any) -> list[DialogueSequence]:
        policy.set_params(params, version, rng=train_state.step_keys(rng, index).rollout)
        profiles = profiles_for_step(run.train_profiles, index, k, run.spec.loop.seed)
        requests = [EpisodeRequest(profiles[d // n], int(d // n), index=int(d)) for d in run.own_dialogues]
        dialogues = await runner.run(requests, version)  # DAPO: groups without signal sampled again (rl.dynamic_sampling)
        return await dynamic_sampling.refill_step(run.spec.rl, lambda again: runner.run(again, version), requests,
                                                  dialogues, run.train_profiles, run.spec.loop.seed, index, k * n)

    return RolloutBuffer(make_batch, max_staleness=run.spec.loop.max_staleness, start_index=start,
                         finalize=simulator.aclose)


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
    cause = (f"{len(failed)} of {len(dialogues)} ended as simulator_error"
             + (f" (last: {errors[-1]})" if errors else "")) if failed else "none had a policy turn"
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
    return {"eval_score": s.score, "eval_success_rate": s.success / n, "eval_failure_rate": s.failure / n,
            "eval_mean_turns": s.scored_turns, "eval_simulator_errors": float(s.simulator_errors),
            "eval_kv_cache_reencodes": float(reencoded_turns(seqs))}

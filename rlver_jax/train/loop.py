"""The training program behind launch/train.py: rollouts -> PPO/GRPO updates -> logs, checkpoints.

`train(spec)` builds the run of a config's spec (rlver_jax.train.spec; rlver_jax.train.run.build_run)
and `train_run(run)` trains it, reading the run's typed settings only (`run.spec.loop`): it resumes
from the newest checkpoint in the work directory and runs `run.spec.loop.steps` steps. Each step takes
the next batch of dialogues from the async rollout buffer, updates the policy (and the critic),
publishes the new parameters to the sampler, and writes metrics (rlver_jax.train.metrics),
transcripts and checkpoints.
Every `eval_every` steps the current policy is scored on held-out profiles with the same
simulator code path, so reward hacking shows up as a gap between the two. What a checkpoint
records and a resume reads back is rlver_jax.train.resume; how the loop stops after a signal or an
error, rlver_jax.train.shutdown; the checks that stop a step before it is saved,
rlver_jax.train.alarms.

On many hosts every process runs this same loop. Rollouts are per process: each runs its own
dialogues of the step (`Run.own_dialogues`, whole GRPO groups) with its own simulator client, on
its own sampling copy of the policy (sampling_copy.SamplingLayout). The finished dialogues are then
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
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlver_jax.parallel import hosts, sharding
from rlver_jax.plots import training_curves
from rlver_jax.rl import dynamic_sampling, train_state
from rlver_jax.rl import program as rl_program
from rlver_jax.rollout import rewards
from rlver_jax.rollout.buffer import RolloutBatch, RolloutBuffer
from rlver_jax.rollout.episodes import EpisodeRequest, EpisodeRunner
from rlver_jax.rollout.evaluation import play_profiles
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.rollout.summary import degenerate_replies, reencoded_turns, reference_metrics, rollout_metrics, summarize
from rlver_jax.rollout.transcripts import discard_from as discard_transcripts
from rlver_jax.rollout.transcripts import write_transcripts
from rlver_jax.rollout.versions import VersionSchedule
from rlver_jax.simulator.agent import clipped_changes
from rlver_jax.simulator.factory import build_simulator
from rlver_jax.simulator.profiles import Profile
from rlver_jax.train import alarms, checkpoint, resume, shutdown
from rlver_jax.train.interrupts import StepGuard, signal_name
from rlver_jax.train.metrics import Writers, check_finite, staleness_metrics, throughput_metrics
from rlver_jax.train.run import Run, build_run
from rlver_jax.train.spec import RunSpec

log = logging.getLogger(__name__)


def train(spec: RunSpec, *, progress: bool = True, on_step: Callable[[int], None] | None = None) -> dict[str, float]:
    """Build the run of `spec` (rlver_jax.train.run.build_run) and train it (`train_run`)."""
    return train_run(build_run(spec), progress=progress, on_step=on_step)


def train_run(run: Run, *, progress: bool = True, on_step: Callable[[int], None] | None = None) -> dict[str, float]:
    """Run (or resume) the training of `run`; returns the last step's metrics. Releases the work
    directory's lock (`run.lock`) when it ends.

    Ctrl-C or SIGTERM finishes the running step (interrupts.StepGuard; the in-loop evaluation is
    skipped, or abandoned when the signal comes during it), saves its checkpoint and raises
    interrupts.TrainingInterrupted, whose message says where the checkpoint is and how to resume; a
    simulator down past config.simulator.outage_budget_s saves the last complete step the same way
    and raises its llm_client.OutageError (exit status 75; one in the middle of a step's in-loop
    evaluation loses that step); a failed checkpoint or transcript write stops the run at once; any
    other error leaves the last complete checkpoint and the finished steps' files as they are.
    `on_step(step)`: told as each step begins (rlver_jax.train.pod names the step when a process is
    lost).
    """
    try:
        return _train(run, progress, on_step or (lambda step: None))
    finally:
        if run.lock is not None:
            run.lock.release()


def _train(run: Run, progress: bool, on_step: Callable[[int], None]) -> dict[str, float]:
    s = run.spec.loop
    manager = checkpoint.make_manager(run.storage.checkpoints, save_every=s.save_every, keep=s.keep,
                                      async_save=s.async_save)
    guard = StepGuard(s.stop_within_s, on_expiry=lambda signum: shutdown.expired(signum, manager, s, run.lock),
                      processes=jax.process_count(), agree=shutdown.process_signals,
                      process_index=jax.process_index())
    state, start, metrics = None, 0, {}
    buffer = writers = None
    norms: dict[str, float] = {}
    versions: dict[int, Any] = {}
    record = resume.run_record(s.seed, run.lora_base, run.spec.resume_record)
    try:
        state, start, meta, previous = resume.restore(manager, run.state, s, run.lora_base)
        # The actor versions the next max_staleness batches are sampled with (`resume.sampling_versions`).
        versions = resume.sampling_versions(s.max_staleness, start, previous)
        if meta is not None:
            resume.log_changes(run.spec, run.storage, meta, start)
        if start >= s.steps:
            resume.say_finished(manager.directory, start, s.steps)
            return {}
        norms = resume.param_norms(state)  # the baseline of the first step's growth check (parts on the devices)
        lowest_degenerate = None  # the run's lowest degenerate_rate so far (alarms.check_degeneration)
        if start and jax.process_index() == 0:
            run.storage.pull("metrics.jsonl")  # a gs:// run resumed elsewhere: the curves so far
        # A host copy of the run key (replicated; every update donates state.rng).
        rng = sharding.replicated_value(state.rng)
        buffer = _rollout_buffer(run, rng, start)
        writers = Writers(run.workdir, start=start, total=s.steps, progress=progress, tracking_settings=run.tracking,
                          config=run.spec.record, table_every=s.eval_every)
        if jax.process_index() == 0:
            discard_transcripts(run.workdir / "transcripts", start)  # steps >= start run again
        sampler = _publish_start(run, buffer, state, versions, start)
        for step in range(start, s.steps):
            t0 = time.perf_counter()
            batch = buffer.get(until=lambda: guard.stopping)
            wait_s = time.perf_counter() - t0
            checkpoint.check(manager)  # the last save is written (or its failure stops the run) before an update
            if (batch is None or guard.processes > 1) and guard.stop_agreed():  # signalled while waiting
                raise KeyboardInterrupt
            guard.begin_step(step)  # from here to the checkpoint, a signal waits for the step to end
            on_step(step)
            if s.max_staleness:  # the actor of this version, for the batches sampled with it after a resume
                versions = {**{v: a for v, a in versions.items() if v > step - s.max_staleness},
                            step: jax.tree.map(jnp.copy, state.actor)}
            else:  # the sampler idles until the next publish: its memory goes to the update
                jax.tree.map(lambda x: x.delete(), sampler)
            state, dialogues, advantages, metrics = _update(run, step, state, batch, wait_s)
            norms = alarms.check_growth(step, norms, metrics, s, manager)
            sampler = _sampling_copy(run, state)
            buffer.publish(step + 1, sampler)
            if s.transcripts and jax.process_index() == 0:
                write_transcripts(run.workdir / "transcripts", step, dialogues, advantages=advantages)
            if s.eval_every and run.eval_profiles and (step + 1) % s.eval_every == 0:
                with writers.evaluating(step, len(run.eval_profiles[:s.eval_max_profiles or None])) as timing:
                    evaluated = _evaluate_unless_stopping(
                        lambda: evaluate(run, sampler, step, train_state.step_keys(rng, step).eval), step, guard)
                metrics.update(evaluated, **(timing if evaluated else {}))
            writers.write(step, metrics, dialogues)
            lowest_degenerate = alarms.check_degeneration(step, lowest_degenerate, metrics, s)
            alarms.check_templates(step, metrics, s)
            checkpoint.save(manager, step + 1, state, resume.checkpoint_meta(step + 1, record, norms, versions),
                            force=step + 1 == s.steps, sampling=resume.sampling_item(versions))
            if jax.process_index() == 0:
                run.storage.push()
            guard.end_step()
    except BaseException as e:  # a signal or an outage past its budget saves the last complete step; others raise
        kept = {**record, "param_norms": norms, **({"sampling_versions": sorted(versions)} if versions else {})}
        stop = shutdown.stopped(e, guard, manager, state, kept, s.workdir, resume.sampling_item(versions))
        if stop is None:
            raise
        raise stop from (None if isinstance(e, KeyboardInterrupt) else e)
    finally:
        guard.close()
        shutdown.shut_down(buffer, manager, writers)
        guard.cancel_clock()
    if jax.process_index() == 0 and writers.metrics_path.exists():
        training_curves(writers.metrics_path, run.workdir / "reward.png", title=pathlib.PurePosixPath(s.workdir).name)
        run.storage.push()
    return metrics


def _publish_start(run: Run, buffer: RolloutBuffer, state: train_state.TrainState, versions: dict[int, Any],
                   start: int) -> Any:
    """Publish to `buffer` the sampling copies the batches from `start` on begin with: the older
    actor `versions` a resume restored, and the state's own as version `start` (returned)."""
    for version, actor in versions.items():
        buffer.publish(version, _sampling_copy(run, state.replace(actor=actor)))
    sampler = _sampling_copy(run, state)
    buffer.publish(start, sampler)
    return sampler


def _sampling_copy(run: Run, state: train_state.TrainState) -> Any:
    """This process's sampling copy of the actor of `state` (LoRA: merged into the base)."""
    return run.sampling_layout.copy(run.update.actor_params(state, run.frozen))


def _evaluate_unless_stopping(evaluation: Callable[[], dict[str, float]], step: int, guard: StepGuard
                              ) -> dict[str, float]:
    """The in-loop evaluation of `step` (`evaluation()`), unless a signal came (it is skipped: the
    checkpoint must be written in bounded time); a signal during it abandons it (one process: the
    update is complete, so the step is saved without its evaluation)."""
    if guard.stopping:
        log.warning("step %d: the in-loop evaluation is skipped (stopping)", step)
        return {}
    if guard.processes > 1:  # every process must stop at the same point: it cannot be cut short
        return evaluation()
    try:
        with guard.interruptible():
            return evaluation()
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
    alarms.check_trainable(step, dialogues, run.workdir / "transcripts")
    if run.spec.rl.shuffle_rewards:  # the random-reward control; every process draws the same permutation
        dialogues = rewards.shuffled(dialogues, seed=run.spec.loop.seed * 1_000_003 + step)
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



def _rollout_buffer(run: Run, rng: np.ndarray, start: int) -> RolloutBuffer:
    """The producer of batch after batch from `start` on: batch i holds this process's dialogues
    of `profiles_for_step(i)` (`run.own_dialogues`; dialogue d is sample d % n of profile d // n),
    dialogue d sampled from fold_in(rollout key of step i, d), each turn by the version of the
    batch's schedule (rollout.versions), dynamic sampling's refills too."""
    simulator = build_simulator(run.spec.simulator)
    sampler = run.spec.engine.build(run.update.actor_cfg, run.chat, run.spec.sampling,
                                    train_state.step_keys(rng, start).rollout)
    runner = EpisodeRunner(sampler, simulator, run.chat, run.spec.rollout, run.spec.rl.reward_mode)
    k, n = run.spec.loop.profiles_per_step, run.spec.loop.n

    async def make_batch(index: int, versions: VersionSchedule) -> list[DialogueSequence]:
        sampler.reseed(train_state.step_keys(rng, index).rollout)
        profiles = profiles_for_step(run.train_profiles, index, k, run.spec.loop.seed)
        requests = [EpisodeRequest(profiles[d // n], int(d // n), index=int(d)) for d in run.own_dialogues]
        # DAPO: groups without signal sampled again (rl.dynamic_sampling)
        dialogues = await runner.run(requests, versions)
        return await dynamic_sampling.refill_step(run.spec.rl, lambda again: runner.run(again, versions), requests,
                                                  dialogues, run.train_profiles, run.spec.loop.seed, index, k * n)

    return RolloutBuffer(make_batch, sampler, max_staleness=run.spec.loop.max_staleness,
                         partial=run.spec.loop.partial_rollouts, start_index=start, finalize=simulator.aclose)


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
    policy = run.spec.engine.build(run.update.actor_cfg, run.chat, run.spec.eval.sampling, key)
    policy.publish(step, params)
    seqs = play_profiles(policy, run.chat, run.spec.eval.simulator, run.spec.eval.rollout, list(enumerate(profiles)),
                         version=step, transcripts_dir=run.workdir / "transcripts")
    s = summarize(seqs)
    n = max(s.scored, 1)
    return {"eval_score": s.score, "eval_success_rate": s.success / n, "eval_user_left_rate": s.failure / n,
            "eval_mean_turns": s.scored_turns, "eval_simulator_errors": float(s.simulator_errors),
            "eval_no_policy_turn": float(s.no_policy_turn),
            "eval_kv_cache_reencodes": float(reencoded_turns(seqs)),
            "eval_degenerate_rate": degenerate_replies(seqs)["degenerate_rate"]}

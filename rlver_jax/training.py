"""The training program behind launch/train.py: rollouts -> PPO/GRPO updates -> logs, checkpoints.

`train(config)` builds everything from a config (configs/base.py), resumes from the newest
checkpoint in the work directory, and runs `config.train.steps` steps. Each step takes the next
batch of dialogues from the async rollout buffer, updates the policy (and the critic), publishes
the new parameters to the sampler, and writes metrics.jsonl, TensorBoard events, transcripts and
checkpoints. Every `eval_every` steps the current policy is scored on held-out profiles with the
same simulator code path, so reward hacking shows up as a gap between the two.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from rlver_jax import chat, checkpoint, sharding
from rlver_jax.eval.plots import training_curves
from rlver_jax.eval.sentient import summarize
from rlver_jax.files import append_jsonl
from rlver_jax.models import hf_io
from rlver_jax.models.config import Qwen2Config, get_preset
from rlver_jax.rl import trainer
from rlver_jax.rl.batch import collate
from rlver_jax.rollout.buffer import RolloutBuffer
from rlver_jax.rollout.episodes import EpisodeRequest, EpisodeRunner, RolloutSettings
from rlver_jax.rollout.policy import JaxPolicy, SamplingSettings
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.rollout.transcripts import write_transcripts
from rlver_jax.simulator.factory import build_simulator, check_endpoint
from rlver_jax.simulator.profiles import Profile, load_profiles
from rlver_jax.tiny_tokenizer import build_tiny_tokenizer

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- config -> parts


def rl_settings(config: ml_collections.ConfigDict) -> trainer.RLSettings:
    dialogues = config.rollout.profiles_per_step * config.rollout.n
    fields = config.rl.to_dict()
    fields["mini_batch_size"] = fields["mini_batch_size"] or dialogues
    fields["micro_batch_size"] = min(fields["micro_batch_size"], fields["mini_batch_size"])
    rl = trainer.RLSettings(**fields)
    if rl.algo == "grpo" and config.rollout.n < 2:
        raise ValueError(f"config.rl.algo='grpo' needs config.rollout.n >= 2 dialogues per profile "
                         f"(got {config.rollout.n}); e.g. --config.rollout.n=4")
    if dialogues % rl.mini_batch_size:
        raise ValueError(f"{dialogues} dialogues per step (config.rollout.profiles_per_step x n) are not a "
                         f"multiple of config.rl.mini_batch_size={rl.mini_batch_size}")
    return rl


def model_config(config: ml_collections.ConfigDict) -> dict[str, Any]:
    m = config.model
    # Runs saved before model.attention existed default to "auto" (every choice gives the same model).
    return dict(param_dtype=m.param_dtype, dtype=m.dtype, scan_layers=m.scan_layers, remat=m.remat,
                attention=m.get("attention", "auto"))


def load_tokenizer(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> chat.ChatTokens:
    path = config.model.tokenizer_path or config.model.path
    if not path:
        if config.model.preset != "tiny":
            raise ValueError("config.model.path is empty: set --config.model.path=/path/to/Qwen2.5-7B-Instruct "
                             "(a local Hugging Face directory), or use a :tiny config for a random CPU model")
        path = workdir / "tokenizer"
        if not (path / "tokenizer.json").exists():
            build_tiny_tokenizer(path, vocab_size=get_preset("tiny").vocab_size)
    return chat.ChatTokens.from_tokenizer(chat.load_tokenizer(path))


def load_policy(config, mesh, rules) -> tuple[Qwen2Config, Any]:
    """The actor: a Hugging Face checkpoint placed shard by shard, or a random tiny model."""
    overrides = model_config(config)
    if config.model.path:
        cfg = hf_io.config_from_hf(_read_json(pathlib.Path(config.model.path) / "config.json"),
                                   **overrides)
        shardings = sharding.param_shardings(cfg, mesh, rules)
        return hf_io.load_pretrained(config.model.path, dtype=overrides.pop("param_dtype"),
                                     shardings=shardings, compute_dtype=overrides.pop("dtype"), **overrides)
    if config.model.preset != "tiny":
        raise ValueError(f"config.model.path is empty for preset {config.model.preset!r}: set "
                         "--config.model.path to a local Hugging Face directory (random init is for tiny only)")
    cfg = get_preset("tiny", **overrides)
    return cfg, sharding.init_sharded_params(cfg, jax.random.PRNGKey(config.seed), mesh, rules)


def _read_json(path: pathlib.Path) -> dict:
    import json

    if not path.exists():
        raise FileNotFoundError(f"{path}: not found; config.model.path must be a Hugging Face model directory")
    return json.loads(path.read_text())


def load_critic(config, actor_cfg: Qwen2Config, actor: Any, mesh, rules) -> tuple[Qwen2Config, Any]:
    """The PPO critic: a Qwen2 with a zero-initialised value head, from config.critic.path or the actor."""
    if config.critic.path:
        cfg, params = hf_io.load_pretrained(
            config.critic.path, dtype=actor_cfg.param_dtype, compute_dtype=actor_cfg.dtype,
            scan_layers=actor_cfg.scan_layers, remat=actor_cfg.remat, attention=actor_cfg.attention,
            value_head=True,
            shardings=sharding.param_shardings(
                actor_cfg.replace(value_head=True), mesh, rules))
        return cfg, params
    cfg, params = trainer.critic_from_actor(actor_cfg, actor)
    return cfg, jax.device_put(params, sharding.param_shardings(cfg, mesh, rules))


def split_profiles(config) -> tuple[list[Profile], list[Profile]]:
    train = load_profiles(config.data.train_profiles or None)
    if not config.data.train_profiles and config.model.preset != "tiny":
        raise ValueError("config.data.train_profiles is empty: set it to a JSONL profile file, e.g. "
                         "--config.data.train_profiles=../shared/data/rlver/train_profile.jsonl")
    if config.data.eval_profiles:
        return train, load_profiles(config.data.eval_profiles)
    k = config.data.eval_holdout
    if k >= len(train):
        raise ValueError(f"config.data.eval_holdout={k} leaves no training profiles out of {len(train)}")
    return (train[:-k], train[-k:]) if k else (train, [])


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


# ----------------------------------------------------------------------------- the run


def rollout_metrics(seqs: list[DialogueSequence]) -> dict[str, float]:
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


class _Writers:
    """metrics.jsonl (appended and flushed every step) and TensorBoard events."""

    def __init__(self, workdir: pathlib.Path):
        from tensorboardX import SummaryWriter

        self.metrics_path = workdir / "metrics.jsonl"
        self.tb = SummaryWriter(str(workdir / "tensorboard")) if jax.process_index() == 0 else None

    def write(self, step: int, metrics: dict[str, float]) -> None:
        if jax.process_index() != 0:
            return
        append_jsonl(self.metrics_path, {"step": step, **metrics})
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.tb.add_scalar(k, v, step)
        self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def train(config: ml_collections.ConfigDict, *, progress: bool = True) -> dict[str, float]:
    """Run (or resume) the training of `config`; returns the last step's metrics."""
    sharding.maybe_initialize_distributed(config.mesh.distributed)
    jax.config.update("jax_threefry_partitionable", True)
    workdir = pathlib.Path(config.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))

    rl = rl_settings(config)
    rollout = RolloutSettings(
        think=config.rollout.think, max_new_tokens=config.rollout.max_new_tokens,
        max_total_tokens=config.rollout.max_total_tokens, format_failure=config.rollout.format_failure,
        pipeline_groups=config.rollout.pipeline_groups)
    sampling_settings = SamplingSettings(
        temperature=config.rollout.temperature, top_p=config.rollout.top_p, top_k=config.rollout.top_k,
        max_new_tokens=config.rollout.max_new_tokens, cache_slots=config.rollout.cache_slots)
    train_profiles, eval_profiles = split_profiles(config)
    check_endpoint(config.simulator)
    chat_tokens = load_tokenizer(config, workdir)

    mesh = sharding.make_mesh(config.mesh.shape)
    rules = config.mesh.rules
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    if rl.mini_batch_size % shards:
        raise ValueError(
            f"mini-batches of {rl.mini_batch_size} dialogues must split over the {shards} data x fsdp shards of "
            f"config.mesh.shape={tuple(config.mesh.shape)}: change config.rollout.profiles_per_step or "
            "config.rl.mini_batch_size, or move devices to the tensor axis")
    actor_cfg, actor = load_policy(config, mesh, rules)
    if actor_cfg.vocab_size < len(chat_tokens.tokenizer):
        raise ValueError(f"tokenizer has {len(chat_tokens.tokenizer)} tokens but the model's vocab_size is "
                         f"{actor_cfg.vocab_size}: config.model.tokenizer_path does not match the model")
    actor_sh = sharding.param_shardings(actor_cfg, mesh, rules)
    ref_params = jax.tree.map(jnp.copy, actor) if rl.uses_reference else None
    optimizer_steps = config.train.steps * rl.ppo_epochs * (
        config.rollout.profiles_per_step * config.rollout.n // rl.mini_batch_size)
    actor_tx = trainer.make_optimizer(trainer.OptimSettings(**config.optim.actor), optimizer_steps)
    critic_cfg = critic = critic_tx = critic_sh = None
    if rl.uses_critic:
        critic_cfg, critic = load_critic(config, actor_cfg, actor, mesh, rules)
        critic_tx = trainer.make_optimizer(trainer.OptimSettings(**config.optim.critic), optimizer_steps)
        critic_sh = sharding.param_shardings(critic_cfg, mesh, rules)
    replicated = NamedSharding(mesh, P())
    state_sh = trainer.TrainState(
        step=replicated, rng=replicated, actor=actor_sh,
        actor_opt=sharding.opt_state_shardings(actor_tx, actor, actor_sh), critic=critic_sh,
        critic_opt=None if critic is None else sharding.opt_state_shardings(critic_tx, critic, critic_sh))
    state = trainer.TrainState(
        step=jax.device_put(jnp.zeros((), jnp.int32), replicated),
        rng=jax.device_put(jax.random.PRNGKey(config.seed), replicated), actor=actor,
        actor_opt=sharding.init_opt_state(actor_tx, actor, actor_sh), critic=critic,
        critic_opt=None if critic is None else sharding.init_opt_state(critic_tx, critic, critic_sh))
    fns = trainer.make_update_fns(rl, actor_cfg, critic_cfg, actor_tx, critic_tx, mesh, state_sh,
                                  None if ref_params is None else actor_sh)

    manager = checkpoint.make_manager(workdir / "checkpoints", save_every=config.checkpoint.save_every,
                                      keep=config.checkpoint.keep, async_save=config.checkpoint.async_save)
    start = 0
    if config.checkpoint.resume and checkpoint.latest_step(manager) is not None:
        state, meta = checkpoint.restore(manager, None, state)
        start = int(meta["step"])
        log.info("resumed from %s at step %d", manager.directory, start)

    simulator = build_simulator(config.simulator)
    policy = JaxPolicy(actor_cfg, chat_tokens, sampling_settings, state.actor, jax.random.PRNGKey(config.seed))
    runner = EpisodeRunner(policy, simulator, chat_tokens, rollout)
    base_key = jax.random.PRNGKey(config.seed + 1)
    k = config.rollout.profiles_per_step

    async def make_batch(index: int, version: int, params: Any) -> list[DialogueSequence]:
        policy.set_params(params, version, rng=jax.random.fold_in(base_key, index))
        profiles = profiles_for_step(train_profiles, index, k, config.seed)
        requests = [EpisodeRequest(p, g) for g, p in enumerate(profiles) for _ in range(config.rollout.n)]
        return await runner.run(requests, version)

    buffer = RolloutBuffer(make_batch, max_staleness=config.rollout.max_staleness, start_index=start,
                           finalize=simulator.aclose)
    writers = _Writers(workdir)
    copy_params = config.rollout.max_staleness > 0  # the update donates; an overlapping sampler needs its own
    buffer.publish(start, jax.tree.map(jnp.copy, state.actor) if copy_params else state.actor)
    bar = _progress(start, config.train.steps, progress)
    metrics: dict[str, float] = {}
    step = start
    try:
        for step in range(start, config.train.steps):
            t0 = time.perf_counter()
            batch = buffer.get()
            if batch.version < step - config.rollout.max_staleness:  # the buffer guarantees this
                raise AssertionError(f"batch of version {batch.version} at step {step}")
            t_wait = time.perf_counter() - t0
            usable = [s for s in batch.sequences if s.trainable]
            if not usable:
                raise RuntimeError(f"step {step}: every dialogue failed in the simulator; see the transcripts")
            tb = collate(usable, batch_size=len(batch.sequences), reward_mode=rl.reward_mode,
                         length_multiple=config.train.length_multiple, pad_id=chat_tokens.end_of_text)
            t1 = time.perf_counter()
            state, update_metrics = trainer.train_on_batch(
                fns, state, tb, ref_params, place=lambda x: sharding.shard_host_batch(mesh, x))
            update_s = time.perf_counter() - t1
            _check_finite(step, update_metrics)
            buffer.publish(step + 1, jax.tree.map(jnp.copy, state.actor) if copy_params else state.actor)
            tokens = float(tb.attention_mask.sum())
            metrics = {**rollout_metrics(batch.sequences), **update_metrics,
                       "tokens_per_second": tokens / max(batch.seconds + update_s, 1e-9),
                       "update_tokens_per_second": tokens / max(update_s, 1e-9),
                       "rollout_seconds": batch.seconds, "update_seconds": update_s,
                       "wait_seconds": t_wait, "policy_lag": float(step - batch.version)}
            if config.train.transcripts and jax.process_index() == 0:
                write_transcripts(workdir / "transcripts", step, batch.sequences)
            if config.train.eval_every and eval_profiles and (step + 1) % config.train.eval_every == 0:
                metrics.update(evaluate(config, actor_cfg, chat_tokens, state.actor, eval_profiles, rollout,
                                        sampling_settings, step))
            writers.write(step, metrics)
            checkpoint.save(manager, step + 1, state, {"step": step + 1, "seed": config.seed},
                            force=step + 1 == config.train.steps)
            bar.update(1)
            bar.set_postfix({k: f"{metrics[k]:.3g}" for k in
                             ("reward_mean", "emotion_mean", "success_rate", "failure_rate", "entropy",
                              "tokens_per_second") if k in metrics}, refresh=False)
    except KeyboardInterrupt:
        log.warning("interrupted: saving a checkpoint of step %d before exiting", int(state.step))
        checkpoint.save(manager, int(state.step), state, {"step": int(state.step), "seed": config.seed}, force=True)
        raise
    finally:
        bar.close()
        buffer.close()
        checkpoint.wait(manager)
        manager.close()
        writers.close()
    if jax.process_index() == 0 and writers.metrics_path.exists():
        training_curves(writers.metrics_path, workdir / "reward.png", title=workdir.name)
    return metrics


def _progress(start: int, total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=start, disable=not enabled or jax.process_index() != 0,
                desc="train", dynamic_ncols=True)


def _check_finite(step: int, metrics: dict[str, float]) -> None:
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    if bad:
        raise FloatingPointError(f"step {step}: non-finite training metrics {bad}")


def evaluate(config, actor_cfg, chat_tokens, params, profiles, rollout: RolloutSettings,
             sampling_settings: SamplingSettings, step: int) -> dict[str, float]:
    """Score the current policy on held-out profiles with the training simulator's code path."""
    if config.train.eval_max_profiles:
        profiles = profiles[:config.train.eval_max_profiles]
    policy = JaxPolicy(actor_cfg, chat_tokens, sampling_settings, params,
                       jax.random.fold_in(jax.random.PRNGKey(config.seed + 2), step))

    # As in the benchmark (configs/eval.py), a reply that breaks the think format is shown to the
    # user as it is rather than ending the dialogue at its current emotion.
    rollout = dataclasses.replace(rollout, format_failure="continue")

    async def run():
        async with build_simulator(config.simulator) as sim:
            runner = EpisodeRunner(policy, sim, chat_tokens, rollout)
            return await runner.run([EpisodeRequest(p, i) for i, p in enumerate(profiles)], step)

    seqs = asyncio.run(run())
    if jax.process_index() == 0:
        write_transcripts(pathlib.Path(config.workdir) / "transcripts", step, seqs, prefix="eval")
    s = summarize(seqs)
    n = max(s["n"], 1)
    return {"eval_score": s["score"], "eval_success_rate": s["success"] / n,
            "eval_failure_rate": s["failure"] / n, "eval_mean_turns": s["mean_turns"],
            "eval_simulator_errors": float(s["simulator_errors"])}

"""PPO and GRPO updates: a train-state pytree and pure, jitted update functions.

One train step (`train_step`: a jitted program per stage, in this order) consumes a TrainBatch
of dialogues' training rows (a dialogue each, or one per turn with think_history "drop";
rlver_jax.rl.batch):
  prepare:    old log-probs (actor), reference log-probs (only with a KL term), values (critic),
              token rewards (minus a KL penalty in "reward" mode) -> advantages and returns;
  actor:      epochs x mini-batches of `actor_update`: gradients accumulated over micro-batches
              with exact mini-batch loss weights, then one AdamW step each;
  critic:     the same for the critic (PPO), on the same prepared inputs and mini-batch order;
  step + 1.
A program per model lets what a program does not read wait in host memory (config.train.offload,
rlver_jax.rl.offload). With LoRA (config.lora.rank > 0) the state's models are their trainable leaves
(adapters; the critic's value head) and every program also reads the one frozen base, which is the
reference too (`model_params`). `UpdateProgram` holds the update side of a run once: the models'
architectures and optimizers, the state's shardings and the jitted programs.
Per-token arrays follow rlver_jax.rl.losses (rlver_jax.rl.logprobs computes them).

Randomness (big_vision style): the state keeps one run key; the draws of train step s (its
rollout batch, its mini-batch order, the evaluation after it) are `step_keys(rng, s)`, split
from fold_in(rng, s). Resuming at step s therefore replays exactly the draws of an unbroken run.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from rlver_jax.parallel import sharding
from rlver_jax.models import lora as lora_lib
from rlver_jax.models.config import Qwen2Config
from rlver_jax.rl import advantages as adv_lib
from rlver_jax.rl import losses
from rlver_jax.rl import offload as offload_lib
from rlver_jax.rl.batch import TrainBatch
from rlver_jax.rl.logprobs import token_logprobs, token_values

Params = Any
NO_LORA = lora_lib.LoraSettings()  # full fine-tuning
ALGOS = ("ppo", "grpo")
KL_MODES = ("loss", "reward")


@dataclasses.dataclass(frozen=True)
class RLSettings:
    """The `config.rl` section as a typed, hashable record (static under jit)."""

    algo: str = "ppo"
    reward_mode: str = "final"
    gamma: float = 1.0
    lam: float = 1.0
    whiten_advantages: bool = True
    grpo_normalize_std: bool = True
    grpo_eps: float = 1e-6
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    dual_clip: float = 0.0  # 0 disables; otherwise c > 1
    value_clip: float = 0.5
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_mode: str = "loss"
    kl_estimator: str = "k3"
    loss_agg_mode: str = "token_mean"
    value_loss_agg_mode: str = "token_mean"  # the critic's loss (losses.AGG_MODES)
    ppo_epochs: int = 1
    mini_batch_size: int = 32  # train-batch rows per optimizer step (with batch_size 0)
    micro_batch_size: int = 8
    # Dialogues per train step: mini-batches are then cut in these units (a batch of more rows, one
    # per dialogue turn, gives each mini-batch proportionally more rows). 0: in the batch's rows, and
    # the batch's rows are a multiple of mini_batch_size (the last mini-batch's real rows may be fewer).
    batch_size: int = 0
    logprob_chunk: int = 1024  # tokens per row through the LM head at a time (rl.logprobs)

    def __post_init__(self):
        checks = [("algo", self.algo, ALGOS), ("kl_mode", self.kl_mode, KL_MODES),
                  ("kl_estimator", self.kl_estimator, tuple(losses.KL_ESTIMATORS)),
                  ("loss_agg_mode", self.loss_agg_mode, tuple(losses.AGG_MODES)),
                  ("value_loss_agg_mode", self.value_loss_agg_mode, tuple(losses.AGG_MODES)),
                  ("reward_mode", self.reward_mode, ("final", "per_turn"))]
        for name, value, valid in checks:
            if value not in valid:
                raise ValueError(f"config.rl.{name}={value!r}; use one of {valid}")
        if self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"config.rl.mini_batch_size={self.mini_batch_size} is not a multiple of "
                f"config.rl.micro_batch_size={self.micro_batch_size}")
        if self.logprob_chunk < 1:
            raise ValueError(f"config.rl.logprob_chunk={self.logprob_chunk} must be >= 1 (tokens per LM-head chunk)")
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ValueError(f"config.rl.dual_clip={self.dual_clip}: use 0 (off) or a value > 1")
        if self.batch_size % self.mini_batch_size:
            raise ValueError(f"{self.batch_size} dialogues per step are not a multiple of "
                             f"config.rl.mini_batch_size={self.mini_batch_size}")

    def minibatches(self, rows: int) -> int:
        """Mini-batches per epoch over a batch of `rows` rows."""
        return (self.batch_size or rows) // self.mini_batch_size

    @property
    def uses_critic(self) -> bool:
        return self.algo == "ppo"

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef != 0.0


@dataclasses.dataclass(frozen=True)
class OptimSettings:
    """AdamW with linear warmup then a constant rate, and global-norm gradient clipping."""

    lr: float = 1e-6
    warmup_ratio: float = 0.02
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """An optax transformation without the learning rate, and the learning rate at a train step: every
    optimizer step of a train step scales `tx`'s update by that step's rate, so the schedule's length
    counts train steps whatever the mini-batches per step (the reference steps its scheduler once per
    train step)."""

    tx: optax.GradientTransformation
    learning_rate: optax.Schedule


def make_optimizer(opt: OptimSettings, total_steps: int) -> Optimizer:
    """`total_steps` counts train steps."""
    warmup = max(int(opt.warmup_ratio * total_steps), 1)
    schedule = optax.join_schedules(
        [optax.linear_schedule(opt.lr / warmup, opt.lr, warmup - 1), optax.constant_schedule(opt.lr)], [warmup - 1])
    tx = optax.chain(
        optax.clip_by_global_norm(opt.grad_clip),
        optax.adamw(1.0, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay))
    return Optimizer(tx, schedule)


# ----------------------------------------------------------------------------- state and keys


class ModelState(NamedTuple):
    """One model's parameters and optimizer state: what its update program reads and donates."""

    params: Params
    opt: Any


MODELS = ("actor", "critic")


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: completed train steps (one per rollout batch)
    rng: jax.Array  # uint32[2] raw key of the run, checkpointable as a plain array; never advanced
    actor: Params
    actor_opt: Any
    critic: Params | None
    critic_opt: Any | None

    def models(self) -> TrainState:
        """What the prepare program reads: the state without its optimizer states."""
        return self.replace(actor_opt=None, critic_opt=None)

    def model(self, name: str) -> ModelState:
        """The parameters and optimizer state of model `name` (one of MODELS)."""
        if name == "actor":
            return ModelState(self.actor, self.actor_opt)
        if name == "critic":
            return ModelState(self.critic, self.critic_opt)
        raise ValueError(f"no model {name!r} in the train state; use one of {MODELS}")

    def with_model(self, name: str, model: ModelState) -> TrainState:
        """The state with model `name`'s parameters and optimizer state replaced by `model`'s."""
        if name == "actor":
            return self.replace(actor=model.params, actor_opt=model.opt)
        if name == "critic":
            return self.replace(critic=model.params, critic_opt=model.opt)
        raise ValueError(f"no model {name!r} in the train state; use one of {MODELS}")


class SeedKeys(NamedTuple):
    init: jax.Array  # the policy's random initialisation
    run: jax.Array  # TrainState.rng


def seed_keys(seed: int) -> SeedKeys:
    """The two keys split from a run's seed."""
    return SeedKeys(*jax.random.split(jax.random.PRNGKey(seed)))


class StepKeys(NamedTuple):
    rollout: jax.Array  # the dialogues of the step's batch
    order: jax.Array  # the step's mini-batch order
    eval: jax.Array  # the in-loop evaluation after the step


def step_keys(rng: jax.Array, step: int | jax.Array) -> StepKeys:
    """The draws of train step `step` from the run key: on the host or traced inside a jit."""
    return StepKeys(*jax.random.split(jax.random.fold_in(rng, step), len(StepKeys._fields)))


def state_shardings(actor_tx: optax.GradientTransformation, actor: Params, actor_sh: Params,
                    critic_tx: optax.GradientTransformation | None = None, critic: Params | None = None,
                    critic_sh: Params | None = None) -> TrainState:
    """NamedShardings of the TrainState: parameters as given, optimizer states mirroring them
    (rlver_jax.parallel.sharding.opt_state_shardings), step and key replicated."""
    replicated = NamedSharding(jax.tree.leaves(actor_sh)[0].mesh, P())
    return TrainState(
        step=replicated, rng=replicated, actor=actor_sh,
        actor_opt=sharding.opt_state_shardings(actor_tx, actor, actor_sh), critic=critic_sh,
        critic_opt=None if critic is None else sharding.opt_state_shardings(critic_tx, critic, critic_sh))


def init_train_state(actor: Params, actor_tx: optax.GradientTransformation, critic: Params | None = None,
                     critic_tx: optax.GradientTransformation | None = None, seed: int = 0,
                     shardings: TrainState | None = None) -> TrainState:
    """The state before step 0 (the key from `seed_keys(seed).run`). With `shardings`
    (`state_shardings`), optimizer states are created in their shards and step and key placed;
    the parameters must already be in theirs."""
    step, rng = jnp.zeros((), jnp.int32), seed_keys(seed).run
    if shardings is None:
        return TrainState(step=step, rng=rng, actor=actor, actor_opt=actor_tx.init(actor), critic=critic,
                          critic_opt=None if critic is None else critic_tx.init(critic))
    return TrainState(
        step=jax.device_put(step, shardings.step), rng=jax.device_put(rng, shardings.rng), actor=actor,
        actor_opt=sharding.init_opt_state(actor_tx, actor, shardings.actor, shardings.actor_opt), critic=critic,
        critic_opt=None if critic is None else sharding.init_opt_state(
            critic_tx, critic, shardings.critic, shardings.critic_opt))


# ----------------------------------------------------------------------------- pure updates


def model_params(lora: lora_lib.LoraSettings, cfg: Qwen2Config, trainable: Params, base: Params | None) -> Params:
    """A model's whole parameter tree from its trainable leaves (a TrainState's `actor` or `critic`):
    in full fine-tuning (rank 0) `trainable` itself; with LoRA the frozen `base` (less its LM head for
    a critic, `cfg.value_head`) with the adapters of `trainable` merged in (lora.merge), plus its other
    leaves (a critic's value head). Gradients of a loss of this tree reach only `trainable`."""
    if not lora.enabled:
        return trainable
    body = {k: v for k, v in base.items() if not (cfg.value_head and k == "lm_head")}
    merged = lora_lib.merge(lora, body, trainable)
    return {**merged, **{k: v for k, v in trainable.items() if k not in body}}


def _micro_split(x, n_micro: int):
    return x.reshape((n_micro, x.shape[0] // n_micro) + x.shape[1:])


def _micro_map(fn, n_micro: int, *arrays):
    """fn over micro-batches (bounded activation memory), results concatenated back."""
    out = jax.lax.map(lambda xs: fn(*xs), tuple(_micro_split(a, n_micro) for a in arrays))
    return jax.tree.map(lambda y: y.reshape((-1,) + y.shape[2:]), out)


def id_bound(rows: int) -> int:
    """An exclusive bound of the group and dialogue ids in a batch of `rows` rows (every process's):
    a dialogue's rows carry ids below the step's dialogue count (at most `rows`), a process's
    padding row b the id rows + b with b < rows (rlver_jax.rl.batch.collate's `padding_ids`)."""
    return 2 * rows


def dialogue_advantages(advantages: jax.Array, mask: jax.Array, dialogue: jax.Array) -> jax.Array:
    """[id_bound(rows)] each dialogue's mean advantage over its policy tokens, indexed by its id
    (`batch["dialogue"]`), 0 for an id without policy tokens; for the transcripts, not the loss."""
    m = mask.astype(jnp.float32)
    n = id_bound(dialogue.shape[0])
    total = jax.ops.segment_sum(jnp.sum(advantages * m, axis=-1), dialogue, n)
    count = jax.ops.segment_sum(jnp.sum(m, axis=-1), dialogue, n)
    return total / jnp.maximum(count, 1.0)


def prepare(rl: RLSettings, actor_cfg: Qwen2Config, critic_cfg: Qwen2Config | None,
            state: TrainState, ref_params: Params | None, batch: dict, lora: lora_lib.LoraSettings = NO_LORA) -> dict:
    """Old log-probs, values, advantages and returns for a whole batch (no gradients). `ref_params`:
    the reference policy; with LoRA it is the frozen base (the adapters off) that both models read."""
    tokens, attn, mask = batch["tokens"], batch["attention_mask"], batch["policy_mask"]
    n_micro = tokens.shape[0] // rl.micro_batch_size
    scored = (tokens, attn, batch["policy_positions"])

    def logprobs(params, t, a, p):
        return token_logprobs(actor_cfg, params, t, a, positions=p, chunk=rl.logprob_chunk)

    actor = model_params(lora, actor_cfg, state.actor, ref_params)
    old_lp = _micro_map(functools.partial(logprobs, actor), n_micro, *scored)
    out = {"old_logprobs": old_lp}
    rewards = batch["rewards"]
    if rl.uses_reference:
        ref_lp = _micro_map(functools.partial(logprobs, ref_params), n_micro, *scored)
        out["ref_logprobs"] = ref_lp
        if rl.kl_mode == "reward":
            rewards = losses.apply_kl_penalty(rewards, old_lp, ref_lp, mask, coef=rl.kl_coef,
                                              estimator=rl.kl_estimator)
    if rl.uses_critic:
        critic = model_params(lora, critic_cfg, state.critic, ref_params)
        values = _micro_map(lambda t, a: token_values(critic_cfg, critic, t, a), n_micro, tokens, attn)
        advantages, returns = adv_lib.gae_advantages(rewards, values, mask, rl.gamma, rl.lam)
        if rl.whiten_advantages:
            advantages = adv_lib.masked_whiten(advantages, mask)
        out.update(values=values, returns=returns)
    else:
        scores = jnp.sum(rewards * mask, axis=-1)
        # A dialogue's rows are consecutive: its first row stands for it in its group's baseline.
        dialogue = batch["dialogue"]
        first_rows = jnp.concatenate([jnp.ones((1,), bool), dialogue[1:] != dialogue[:-1]])
        seq_adv = adv_lib.grpo_advantages(scores, batch["group"], id_bound(tokens.shape[0]),
                                          normalize_std=rl.grpo_normalize_std, eps=rl.grpo_eps,
                                          members=first_rows)
        advantages = adv_lib.broadcast_to_tokens(seq_adv, mask)
    out["advantages"] = advantages
    return out


def _actor_loss(rl: RLSettings, cfg: Qwen2Config, params, mb):
    lp, ent = token_logprobs(cfg, params, mb["tokens"], mb["attention_mask"], with_entropy=True,
                             positions=mb["policy_positions"], chunk=rl.logprob_chunk)
    mask, w = mb["policy_mask"], mb["weights"]
    pg, pg_metrics = losses.ppo_policy_loss(
        lp, mb["old_logprobs"], mb["advantages"], mask, clip_eps_low=rl.clip_eps_low,
        clip_eps_high=rl.clip_eps_high, dual_clip=rl.dual_clip or None)
    loss = jnp.sum(pg * w) - rl.entropy_coef * jnp.sum(ent * w)
    metrics = {"policy_loss": jnp.sum(pg * w), "entropy": jnp.sum(ent * w)}
    if rl.uses_reference:
        kl = losses.kl_divergence(lp, mb["ref_logprobs"], rl.kl_estimator)
        metrics["kl_ref"] = jnp.sum(kl * w)
        if rl.kl_mode == "loss":
            loss = loss + rl.kl_coef * jnp.sum(kl * w)
    # Metrics that are means per micro-batch get summed over micro-batches: weight them.
    frac = jnp.sum(w)
    metrics.update({k: v * frac for k, v in pg_metrics.items()})
    return loss, metrics


def _critic_loss(rl: RLSettings, cfg: Qwen2Config, params, mb):
    values = token_values(cfg, params, mb["tokens"], mb["attention_mask"])
    vl, vl_metrics = losses.value_loss(values, mb["values"], mb["returns"], mb["policy_mask"],
                                       clip_range=rl.value_clip)
    w = mb["value_weights"]
    frac = jnp.sum(w)
    return jnp.sum(vl * w), {"value_loss": jnp.sum(vl * w), **{k: v * frac for k, v in vl_metrics.items()}}


def micro_batches(rl: RLSettings, batch: dict, rows: jax.Array) -> dict:
    """The mini-batch `batch[rows]` with its loss weights, as [micro-batches, micro_batch_size, ...].
    The rows are gathered inside the program, so the batch stays on the mesh."""
    mb = {k: v[rows] for k, v in batch.items()}
    mb["weights"] = losses.loss_weights(mb["policy_mask"], rl.loss_agg_mode)
    mb["value_weights"] = losses.loss_weights(mb["policy_mask"], rl.value_loss_agg_mode)
    n_micro = mb["tokens"].shape[0] // rl.micro_batch_size
    return jax.tree.map(lambda x: _micro_split(x, n_micro), mb)


def _optimizer_step(name: str, loss_fn, tx, params, opt_state, micro: dict, lr: jax.Array):
    """Gradients of `loss_fn(params, micro-batch) -> (loss, metrics)` accumulated over the
    micro-batches, then one step of `tx` scaled by `lr`; metrics get `{name}_grad_norm` and `{name}_update_norm`."""
    grad_fn = jax.grad(loss_fn, argnums=0, has_aux=True)

    def body(carry, xs):
        g_acc, m_acc = carry
        g, m = grad_fn(params, xs)
        return (jax.tree.map(jnp.add, g_acc, g), jax.tree.map(jnp.add, m_acc, m)), None

    zeros_g = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    first = jax.tree.map(lambda x: x[0], micro)
    zeros_m = jax.tree.map(jnp.zeros_like, jax.eval_shape(lambda: loss_fn(params, first)[1]))
    (g, m), _ = jax.lax.scan(body, (zeros_g, zeros_m), micro)
    updates, opt_state = tx.update(jax.tree.map(lambda u, p: u.astype(p.dtype), g, params), opt_state, params)
    updates = jax.tree.map(lambda u: u * jnp.asarray(lr, u.dtype), updates)
    m.update({f"{name}_grad_norm": optax.global_norm(g), f"{name}_update_norm": optax.global_norm(updates)})
    return optax.apply_updates(params, updates), opt_state, m


def actor_update(rl: RLSettings, cfg: Qwen2Config, tx, lora: lora_lib.LoraSettings, params: Params, opt_state,
                 base: Params | None, micro: dict, lr: jax.Array):
    """The actor's optimizer step on one mini-batch (`micro_batches`) at learning rate `lr`: (params,
    opt_state, metrics). `params`: its trainable leaves (`model_params` with `base`)."""
    loss = lambda p, x: _actor_loss(rl, cfg, model_params(lora, cfg, p, base), x)
    return _optimizer_step("actor", loss, tx, params, opt_state, micro, lr)


def critic_update(rl: RLSettings, cfg: Qwen2Config, tx, lora: lora_lib.LoraSettings, params: Params, opt_state,
                  base: Params | None, micro: dict, lr: jax.Array):
    """The critic's optimizer step on one mini-batch (`micro_batches`) at learning rate `lr`: (params,
    opt_state, metrics). `params`: its trainable leaves (`model_params` with `base`)."""
    loss = lambda p, x: _critic_loss(rl, cfg, model_params(lora, cfg, p, base), x)
    return _optimizer_step("critic", loss, tx, params, opt_state, micro, lr)


def minibatch_rows(rl: RLSettings, key: jax.Array, batch_size: int, padding: jax.Array | None = None) -> jax.Array:
    """[ppo_epochs x mini-batches, rows per mini-batch] row indices of a batch of `batch_size`
    rows: each epoch a fresh permutation of the rows cut into `rl.minibatches` mini-batches
    (rows sorted within one). `padding` (bool [batch_size]): those rows go last (in permuted order),
    so every mini-batch but the last ones is full of real rows and the padding fills the tail."""
    perms = jax.vmap(lambda k: jax.random.permutation(k, batch_size))(jax.random.split(key, rl.ppo_epochs))
    if padding is not None:  # a stable sort keeps the permutation among real and among padding rows
        perms = jnp.take_along_axis(perms, jnp.argsort(padding[perms], axis=-1, stable=True), axis=-1)
    return jnp.sort(perms.reshape(rl.ppo_epochs * rl.minibatches(batch_size), -1), axis=-1).astype(jnp.int32)


def update_inputs(batch: dict, prepared: dict) -> dict:
    """The arrays the mini-batch updates read: the batch and `prepare`'s outputs, less what only
    `prepare` reads."""
    return {k: v for k, v in {**batch, **prepared}.items() if k not in ("sample_logprobs", "group", "dialogue", "rewards")}


def prepare_step(rl: RLSettings, actor_cfg: Qwen2Config, critic_cfg: Qwen2Config | None, models: TrainState,
                 ref_params: Params | None, batch: dict, lora: lora_lib.LoraSettings = NO_LORA
                 ) -> tuple[dict, jax.Array, dict, jax.Array]:
    """The train step's first program: `prepare` on the batch, the arrays the updates read
    (`update_inputs`), the step's mini-batch rows (`step_keys(state.rng, state.step).order`), the
    sampler-agreement metric and each dialogue's advantage (`dialogue_advantages`). `models` is
    the state without its optimizer states (unread)."""
    prepared = prepare(rl, actor_cfg, critic_cfg, models, ref_params, batch, lora)
    mask = batch["policy_mask"]
    rows = minibatch_rows(rl, step_keys(models.rng, models.step).order, mask.shape[0], jnp.sum(mask, -1) == 0)
    diff = jnp.abs(prepared["old_logprobs"] - batch["sample_logprobs"])
    metrics = {"logprob_diff_sampler": jnp.sum(diff * mask) / jnp.maximum(jnp.sum(mask), 1.0)}
    advantages = dialogue_advantages(prepared["advantages"], mask, batch["dialogue"])
    return update_inputs(batch, prepared), rows, metrics, advantages


def model_epochs(name: str, rl: RLSettings, update: Callable, opt: Optimizer, step: jax.Array, params: Params,
                 opt_state, base: Params | None, inputs: dict, rows: jax.Array) -> tuple[Params, Any, dict]:
    """One model's program of a train step: `ppo_epochs` x mini-batches of `update(params,
    opt_state, base, micro, lr) -> (params, opt_state, metrics)` (actor_update or critic_update; `base`:
    LoRA's frozen base, None in full fine-tuning) in the order
    `rows`, all at the train step's learning rate; a mini-batch of padding rows only (the processes of a
    multi-host run pad to the most rows any of them holds) is skipped. Metrics are means over the
    mini-batches run, with `{name}_lr`, `optimizer_steps` (those run, all epochs) and the parameter norm
    after the step. The actor's and the critic's programs read the same prepared inputs and not each
    other's parameters, so running one after the other is PPO's joint update exactly."""
    lr = jnp.asarray(opt.learning_rate(step), jnp.float32)

    def run(carry, r):
        p, o, m = update(*carry, base, micro_batches(rl, inputs, r), lr)
        return (p, o), m

    def body(carry, r):
        zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(run, carry, r)[1])
        real = jnp.any(inputs["policy_mask"][r] > 0)
        carry, m = jax.lax.cond(real, run, lambda c, _: (c, zeros), carry, r)
        return carry, (m, real.astype(jnp.float32))

    (params, opt_state), (history, real) = jax.lax.scan(body, (params, opt_state), rows)
    steps = jnp.sum(real)
    metrics = jax.tree.map(lambda x: jnp.sum(x * real, axis=0) / jnp.maximum(steps, 1.0), history)
    metrics.update({f"{name}_lr": lr, "optimizer_steps": steps})
    metrics[f"{name}_param_norm"] = optax.global_norm(params)
    return params, opt_state, metrics


# ----------------------------------------------------------------------------- host driver


@dataclasses.dataclass(frozen=True)
class UpdateProgram:
    """The update side of one run, built once (shardings fixed at build time): the models'
    architectures and optimizers, the state's shardings and the train step's jitted programs:
    `prepare` (models, ref, batch) -> (inputs, rows, metrics, dialogue advantages); `actor` and
    (PPO) `critic` (step, params, opt_state, base, inputs, rows) -> (params, opt_state, metrics), their
    model donated (`base`: `ref` with LoRA, else None); `next_step` (step) -> step + 1. `train_step`
    runs them in that order. With LoRA (`lora.rank` > 0) the state's models are their trainable
    leaves (`model_params`) and `ref` is the frozen base, which every program reads."""

    rl: RLSettings
    actor_cfg: Qwen2Config
    critic_cfg: Qwen2Config | None  # None: no critic (GRPO)
    actor_opt: Optimizer
    critic_opt: Optimizer | None
    prepare: Callable
    actor: Callable
    critic: Callable | None
    next_step: Callable
    mesh: Any = None  # batches are split over its batch axes; None: the default device
    offload: str = "none"  # a mode of rlver_jax.rl.offload.OFFLOAD
    shardings: TrainState | None = None  # the state's, in device memory (with a mesh)
    ref_shardings: Any | None = None  # the frozen reference policy's (a KL term, or LoRA's base)
    lora: lora_lib.LoraSettings = NO_LORA
    merge: Callable | None = None  # LoRA: (actor adapters, base) -> the merged actor, in the base's layout

    def base(self, ref_params: Params | None) -> Params | None:
        """What the model programs read besides their model: LoRA's frozen base, else nothing."""
        return ref_params if self.lora.enabled else None

    def actor_params(self, state: TrainState, ref_params: Params | None) -> Params:
        """The actor's whole parameter tree, for sampling: with LoRA its adapters merged into the
        base (one jitted merge into the base's layout), else the state's actor itself."""
        return state.actor if self.merge is None else self.merge(state.actor, ref_params)

    def model_programs(self) -> list[tuple[str, Callable]]:
        """(model, its update program) in the order a train step runs them."""
        return [(name, fn) for name, fn in (("actor", self.actor), ("critic", self.critic)) if fn is not None]


def make_update_program(rl: RLSettings, actor_cfg: Qwen2Config, critic_cfg: Qwen2Config | None,
                        actor_opt: Optimizer, critic_opt: Optimizer | None, mesh=None, state_shardings=None,
                        ref_shardings=None, rules=None, offload: str = "none",
                        lora: lora_lib.LoraSettings = NO_LORA) -> UpdateProgram:
    """Jit the train step's programs; each model's program donates its parameters and optimizer state.

    With a mesh and the state's shardings (`state_shardings`), parameters and optimizer states
    keep their layout across steps, and every batch array is split over the batch axes; `rules`
    (config.mesh.rules) may split the residual stream's tokens (sharding.jit_sharded).
    `offload` (a mode of rlver_jax.rl.offload.OFFLOAD, with a mesh): what waits in host memory
    when (config.train.offload). `lora` (config.lora): the state's models are their trainable
    leaves on the frozen base passed as the reference (`model_params`).
    """
    offload_lib.check_mode(offload, mesh)
    prepare_fn = functools.partial(prepare_step, rl, actor_cfg, critic_cfg, lora=lora)
    actor_fn = functools.partial(model_epochs, "actor", rl,
                                 functools.partial(actor_update, rl, actor_cfg, actor_opt.tx, lora), actor_opt)
    critic_fn = None if critic_opt is None else functools.partial(
        model_epochs, "critic", rl, functools.partial(critic_update, rl, critic_cfg, critic_opt.tx, lora), critic_opt)
    merge = None
    if lora.enabled:  # the sampler's actor: the base's layout on a mesh
        merge = jax.jit(functools.partial(model_params, lora, actor_cfg),
                        out_shardings=None if mesh is None else ref_shardings)
    common = dict(rl=rl, actor_cfg=actor_cfg, critic_cfg=critic_cfg, actor_opt=actor_opt, critic_opt=critic_opt,
                  lora=lora, merge=merge)
    if mesh is None:
        jit = functools.partial(jax.jit, donate_argnums=(1, 2))
        return UpdateProgram(**common, prepare=jax.jit(prepare_fn), actor=jit(actor_fn),
                             critic=critic_fn and jit(critic_fn), next_step=jax.jit(lambda s: s + 1, donate_argnums=0),
                             ref_shardings=ref_shardings)
    batch = NamedSharding(mesh, P(sharding.BATCH_AXES))  # a prefix: every leaf of a batch dict
    replicated = NamedSharding(mesh, P())
    sh = state_shardings
    jit = functools.partial(sharding.jit_sharded, rules=rules)
    base_sh = ref_shardings if lora.enabled else None

    def model_jit(fn, params_sh, opt_sh):
        return jit(fn, (replicated, params_sh, opt_sh, base_sh, batch, replicated), (params_sh, opt_sh, replicated),
                   donate_argnums=(1, 2))

    return UpdateProgram(
        **common,
        prepare=jit(prepare_fn, (sh.models(), ref_shardings, batch), (batch, replicated, replicated, replicated)),
        actor=model_jit(actor_fn, sh.actor, sh.actor_opt),
        critic=critic_fn and model_jit(critic_fn, sh.critic, sh.critic_opt),
        next_step=jit(lambda s: s + 1, (replicated,), replicated, donate_argnums=(0,)),
        mesh=mesh, offload=offload, shardings=sh, ref_shardings=ref_shardings)


def train_step(program: UpdateProgram, state: TrainState, ref_params: Params | None, batch: dict
               ) -> tuple[TrainState, dict, jax.Array]:
    """One train step on placed arrays: prepare, then `ppo_epochs` passes over mini-batches of
    the actor's updates, then the critic's (PPO), then step + 1; the state is consumed. Metrics
    are replicated device scalars, as is each dialogue's advantage (`dialogue_advantages`).
    Before each program the state's parts go where `program.offload` has them (rlver_jax.rl.offload.place),
    and after the last to where they rest between steps."""

    def place(state: TrainState, stage: str) -> TrainState:
        return offload_lib.place(state, stage, program.offload, program.shardings)

    state = place(state, "prepare")
    inputs, rows, metrics, advantages = program.prepare(state.models(), ref_params, batch)
    for name, fn in program.model_programs():
        state = place(state, name)
        params, opt_state, m = fn(state.step, *state.model(name), program.base(ref_params), inputs, rows)
        state = state.with_model(name, ModelState(params, opt_state))
        metrics.update(m)
    state = place(state, "rest")
    return state.replace(step=program.next_step(state.step)), metrics, advantages


def train_on_batch(program: UpdateProgram, state: TrainState, batch: TrainBatch, ref_params: Params | None = None,
                   policy_tokens: int | None = None) -> tuple[TrainState, dict[str, float], np.ndarray]:
    """One train step on the device: the batch is placed explicitly (this process's rows on the
    mesh: rlver_jax.parallel.sharding.shard_host_batch), the step's jitted programs run, and its
    metrics (reduced on device, replicated) come back as floats from this process's copy, with each
    dialogue's advantage (`dialogue_advantages`, indexed by the batch's global dialogue ids: every
    process has all of them); nothing else crosses between host and device.
    `policy_tokens`: see rl.batch.policy_positions. Returns the new state (step + 1)."""
    arrays = batch.arrays(policy_tokens)
    mesh = program.mesh
    device_batch = jax.device_put(arrays) if mesh is None else sharding.shard_host_batch(mesh, arrays)
    bsz, rl = device_batch["tokens"].shape[0], program.rl  # the global batch: every process's rows
    if bsz % (rl.batch_size or rl.mini_batch_size):
        raise ValueError(f"batch of {bsz} rows is not a multiple of config.rl.mini_batch_size={rl.mini_batch_size}"
                         + (f" and of the {rl.batch_size} dialogues per step" if rl.batch_size else ""))
    state, metrics, advantages = train_step(program, state, ref_params, device_batch)
    return (state, {k: float(sharding.replicated_value(v)) for k, v in metrics.items()},
            sharding.replicated_value(advantages))

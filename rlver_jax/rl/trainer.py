"""PPO and GRPO updates: a train-state pytree and pure, jitted update functions.

One update consumes a TrainBatch of whole dialogues:
  prepare:    old log-probs (actor), reference log-probs (only with a KL term), values (critic),
              token rewards (minus a KL penalty in "reward" mode) -> advantages and returns;
  epochs x mini-batches of `update_minibatch`: gradients accumulated over micro-batches with
              exact mini-batch loss weights, then one AdamW step for the actor (and the critic).
Per-token arrays follow rlver_jax.rl.losses: logprobs[b, t] = log pi(token_t | tokens_<t), and
values[b, t] is the critic's value of the state before token t.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from rlver_jax import sharding
from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config
from rlver_jax.rl import advantages as adv_lib
from rlver_jax.rl import losses
from rlver_jax.rl.batch import TrainBatch

Params = Any
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
    ppo_epochs: int = 1
    mini_batch_size: int = 32
    micro_batch_size: int = 8

    def __post_init__(self):
        checks = [("algo", self.algo, ALGOS), ("kl_mode", self.kl_mode, KL_MODES),
                  ("kl_estimator", self.kl_estimator, tuple(losses.KL_ESTIMATORS)),
                  ("loss_agg_mode", self.loss_agg_mode, tuple(losses.AGG_MODES)),
                  ("reward_mode", self.reward_mode, ("final", "per_turn"))]
        for name, value, valid in checks:
            if value not in valid:
                raise ValueError(f"config.rl.{name}={value!r}; use one of {valid}")
        if self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"config.rl.mini_batch_size={self.mini_batch_size} is not a multiple of "
                f"config.rl.micro_batch_size={self.micro_batch_size}")
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ValueError(f"config.rl.dual_clip={self.dual_clip}: use 0 (off) or a value > 1")

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


def make_optimizer(opt: OptimSettings, total_steps: int) -> optax.GradientTransformation:
    """`total_steps` counts optimizer steps (train steps x epochs x mini-batches)."""
    warmup = max(int(opt.warmup_ratio * total_steps), 1)
    schedule = optax.join_schedules(
        [optax.linear_schedule(opt.lr / warmup, opt.lr, warmup - 1), optax.constant_schedule(opt.lr)], [warmup - 1])
    return optax.chain(
        optax.clip_by_global_norm(opt.grad_clip),
        optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay))


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: completed train steps (one per rollout batch)
    rng: jax.Array  # uint32[2] raw key, checkpointable as a plain array
    actor: Params
    actor_opt: Any
    critic: Params | None
    critic_opt: Any | None


def init_train_state(actor: Params, actor_tx, critic: Params | None, critic_tx, seed: int) -> TrainState:
    return TrainState(
        step=jnp.zeros((), jnp.int32), rng=jax.random.PRNGKey(seed), actor=actor,
        actor_opt=actor_tx.init(actor), critic=critic,
        critic_opt=None if critic is None else critic_tx.init(critic))


def critic_from_actor(actor_cfg: Qwen2Config, actor: Params) -> tuple[Qwen2Config, Params]:
    """A critic initialised from the actor's weights, with a zero-initialised value head."""
    critic_cfg = actor_cfg.replace(value_head=True)
    head = {k: v for k, v in qwen2.init_params(critic_cfg.replace(num_layers=0), jax.random.key(0)).items()
            if k.startswith("value_")}
    return critic_cfg, {**jax.tree.map(jnp.array, actor), **head}


# ----------------------------------------------------------------------------- model outputs


def _shift_right(x_BT: jax.Array) -> jax.Array:
    return jnp.pad(x_BT[:, :-1], ((0, 0), (1, 0)))


def _logit_stats(logits_NV: jax.Array, targets_N: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """log-softmax at the targets, entropy and log-sum-exp per row, without a [N, V] log-softmax.

    Rows are flattened to 2-D: XLA's CPU backend reduces a product over the last axis of a 3-D
    array several times slower than over a 2-D one. The two sums are one variadic reduction so
    exp runs once per logit without materialising it.
    """
    row_max = jnp.max(logits_NV, axis=-1, keepdims=True)
    shifted = logits_NV - row_max  # exp cannot overflow
    e = jnp.exp(shifted)
    zero = np.float32(0)
    sum_e, sum_e_shifted = jax.lax.reduce(
        (e, e * shifted), (zero, zero), lambda a, b: (a[0] + b[0], a[1] + b[1]), (1,))
    log_sum_e = jnp.log(sum_e)
    # H = log sum e - E_p[shifted], since log p = shifted - log sum e and sum p = 1.
    entropy = log_sum_e - sum_e_shifted / sum_e
    logprob = jnp.take_along_axis(shifted, targets_N[:, None], axis=-1)[:, 0] - log_sum_e
    return logprob, entropy, row_max[:, 0] + log_sum_e


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _head_logprobs(cfg: Qwen2Config, params: Params, h_BTD: jax.Array, targets_BT: jax.Array):
    """log pi(target) and entropy [B, T] from hidden states through the LM head, in fp32.

    A custom VJP because autodiff of log_softmax + entropy keeps several fp32 [B, T, V] arrays
    alive and re-runs exp over them; here the backward pass needs only the logits and one exp.
    """
    return _head_logprobs_fwd(cfg, params, h_BTD, targets_BT)[0]


def _head_logprobs_fwd(cfg: Qwen2Config, params: Params, h_BTD: jax.Array, targets_BT: jax.Array):
    b, t = targets_BT.shape
    logits = qwen2.logits_from_hidden(cfg, params, h_BTD).reshape(b * t, -1)
    logprob, entropy, lse = _logit_stats(logits, targets_BT.reshape(-1))
    out = (logprob.reshape(b, t), entropy.reshape(b, t))
    return out, (params, h_BTD, targets_BT, logits, lse, entropy)


def _head_logprobs_bwd(cfg: Qwen2Config, residuals, cotangents):
    params, h_BTD, targets_BT, logits, lse, entropy = residuals
    g_lp, g_ent = (c.reshape(-1, 1) for c in cotangents)
    logp = logits - lse[:, None]
    p = jnp.exp(logp)
    onehot = jnp.arange(logits.shape[-1])[None, :] == targets_BT.reshape(-1, 1)
    # d logp_target / dz = onehot - p;  dH / dz = -p (log p + H).
    d_logits = g_lp * (onehot - p) - g_ent * p * (logp + entropy[:, None])
    _, head_vjp = jax.vjp(lambda pr, h: qwen2.logits_from_hidden(cfg, pr, h), params, h_BTD)
    d_params, d_h = head_vjp(d_logits.reshape(h_BTD.shape[:2] + logits.shape[-1:]))
    return d_params, d_h, None


_head_logprobs.defvjp(_head_logprobs_fwd, _head_logprobs_bwd)


def token_logprobs(cfg: Qwen2Config, params: Params, tokens, attention_mask, with_entropy: bool = False,
                   positions: jax.Array | None = None):
    """log pi(token_t | tokens_<t) aligned to t (0 at t = 0), and optionally the entropy at t.

    positions [B, C] (rlver_jax.rl.batch.policy_positions): run the LM head only at these token
    indices (0 pads a row) and return 0 elsewhere; None scores every token. The head is a quarter
    of a 0.5B model's FLOPs and its [tokens, vocab] logits the largest activation at 7B; the
    losses never read the user and template tokens, so scoring only policy tokens saves both.
    """
    h, _ = qwen2.hidden_states(cfg, params, tokens, attention_mask)
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    # Token t is predicted from the hidden state at t - 1; the pad index 0 reads h[0] and its
    # result is dropped below (t = 0 has no log-prob).
    h_sel = jnp.take_along_axis(h, jnp.maximum(positions - 1, 0)[..., None], axis=1)
    lp_sel, ent_sel = _head_logprobs(cfg, params, h_sel, jnp.take_along_axis(tokens, positions, axis=1))
    rows = jnp.arange(tokens.shape[0])[:, None]
    keep = positions > 0
    lp, ent = (jnp.zeros(tokens.shape, jnp.float32).at[rows, positions].add(jnp.where(keep, x, 0.0))
               for x in (lp_sel, ent_sel))
    return (lp, ent) if with_entropy else lp


def token_values(cfg: Qwen2Config, params: Params, tokens, attention_mask) -> jax.Array:
    """V(state before token t), aligned to t."""
    h, _ = qwen2.hidden_states(cfg, params, tokens, attention_mask)
    return _shift_right(qwen2.values_from_hidden(cfg, params, h))


def _micro_split(x, n_micro: int):
    return x.reshape((n_micro, x.shape[0] // n_micro) + x.shape[1:])


def _micro_map(fn, n_micro: int, *arrays):
    """fn over micro-batches (bounded activation memory), results concatenated back."""
    out = jax.lax.map(lambda xs: fn(*xs), tuple(_micro_split(a, n_micro) for a in arrays))
    return jax.tree.map(lambda y: y.reshape((-1,) + y.shape[2:]), out)


# ----------------------------------------------------------------------------- pure updates


def prepare(rl: RLSettings, actor_cfg: Qwen2Config, critic_cfg: Qwen2Config | None,
            state: TrainState, ref_params: Params | None, batch: dict) -> dict:
    """Old log-probs, values, advantages and returns for a whole batch (no gradients)."""
    tokens, attn, mask = batch["tokens"], batch["attention_mask"], batch["policy_mask"]
    n_micro = tokens.shape[0] // rl.micro_batch_size
    scored = (tokens, attn, batch["policy_positions"])
    old_lp = _micro_map(lambda t, a, p: token_logprobs(actor_cfg, state.actor, t, a, positions=p), n_micro, *scored)
    out = {"old_logprobs": old_lp}
    rewards = batch["rewards"]
    if rl.uses_reference:
        ref_lp = _micro_map(lambda t, a, p: token_logprobs(actor_cfg, ref_params, t, a, positions=p), n_micro, *scored)
        out["ref_logprobs"] = ref_lp
        if rl.kl_mode == "reward":
            rewards = losses.apply_kl_penalty(rewards, old_lp, ref_lp, mask, coef=rl.kl_coef,
                                              estimator=rl.kl_estimator)
    if rl.uses_critic:
        values = _micro_map(lambda t, a: token_values(critic_cfg, state.critic, t, a), n_micro, tokens, attn)
        advantages, returns = adv_lib.gae_advantages(rewards, values, mask, rl.gamma, rl.lam)
        if rl.whiten_advantages:
            advantages = adv_lib.masked_whiten(advantages, mask)
        out.update(values=values, returns=returns)
    else:
        scores = jnp.sum(rewards * mask, axis=-1)
        seq_adv = adv_lib.grpo_advantages(scores, batch["group"], 2 * tokens.shape[0],
                                          normalize_std=rl.grpo_normalize_std, eps=rl.grpo_eps)
        advantages = adv_lib.broadcast_to_tokens(seq_adv, mask)
    out["advantages"] = advantages
    return out


def _actor_loss(rl: RLSettings, cfg: Qwen2Config, params, mb):
    lp, ent = token_logprobs(cfg, params, mb["tokens"], mb["attention_mask"], with_entropy=True,
                             positions=mb["policy_positions"])
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


def update_minibatch(rl: RLSettings, actor_cfg: Qwen2Config, critic_cfg: Qwen2Config | None,
                     actor_tx, critic_tx, state: TrainState, batch: dict, rows: jax.Array
                     ) -> tuple[TrainState, dict]:
    """One optimizer step on the mini-batch `batch[rows]`, gradients accumulated over its
    micro-batches. The rows are gathered inside the program, so the batch stays on the mesh."""
    mb = {k: v[rows] for k, v in batch.items()}
    mb["weights"] = losses.loss_weights(mb["policy_mask"], rl.loss_agg_mode)
    mb["value_weights"] = losses.loss_weights(mb["policy_mask"], "token_mean")
    n_micro = mb["tokens"].shape[0] // rl.micro_batch_size
    micro = jax.tree.map(lambda x: _micro_split(x, n_micro), mb)

    def accumulate(fn, params):
        grad_fn = jax.grad(fn, argnums=0, has_aux=True)

        def body(carry, xs):
            g_acc, m_acc = carry
            g, m = grad_fn(params, xs)
            return (jax.tree.map(jnp.add, g_acc, g), jax.tree.map(jnp.add, m_acc, m)), None

        zeros_g = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        first = jax.tree.map(lambda x: x[0], micro)
        zeros_m = jax.tree.map(jnp.zeros_like, jax.eval_shape(lambda: fn(params, first)[1]))
        (g, m), _ = jax.lax.scan(body, (zeros_g, zeros_m), micro)
        return g, m

    metrics = {}
    g, m = accumulate(lambda p, x: _actor_loss(rl, actor_cfg, p, x), state.actor)
    metrics.update(m, actor_grad_norm=optax.global_norm(g))
    updates, actor_opt = actor_tx.update(jax.tree.map(lambda u, p: u.astype(p.dtype), g, state.actor),
                                         state.actor_opt, state.actor)
    state = state.replace(actor=optax.apply_updates(state.actor, updates), actor_opt=actor_opt)
    if rl.uses_critic:
        g, m = accumulate(lambda p, x: _critic_loss(rl, critic_cfg, p, x), state.critic)
        metrics.update(m, critic_grad_norm=optax.global_norm(g))
        updates, critic_opt = critic_tx.update(g, state.critic_opt, state.critic)
        state = state.replace(critic=optax.apply_updates(state.critic, updates), critic_opt=critic_opt)
    return state, metrics


# ----------------------------------------------------------------------------- host driver


@dataclasses.dataclass(frozen=True)
class UpdateFns:
    """The jitted functions of one training run (built once; shardings fixed at build time)."""

    prepare: Callable
    update_minibatch: Callable
    rl: RLSettings


def make_update_fns(rl: RLSettings, actor_cfg: Qwen2Config, critic_cfg: Qwen2Config | None,
                    actor_tx, critic_tx, mesh=None, state_shardings=None, ref_shardings=None) -> UpdateFns:
    """Jit `prepare` and `update_minibatch`; the state buffer is donated to the update.

    With a mesh and the state's shardings (rlver_jax.sharding), parameters and optimizer states
    keep their layout across steps, and every batch array is split over the batch axes.
    """
    prep = functools.partial(prepare, rl, actor_cfg, critic_cfg)
    upd = functools.partial(update_minibatch, rl, actor_cfg, critic_cfg, actor_tx, critic_tx)
    if mesh is None:
        return UpdateFns(jax.jit(prep), jax.jit(upd, donate_argnums=(0,)), rl)
    batch = NamedSharding(mesh, P(sharding.BATCH_AXES))  # a prefix: every leaf of the batch dict
    replicated = NamedSharding(mesh, P())
    return UpdateFns(
        sharding.jit_sharded(prep, (state_shardings, ref_shardings, batch), batch),
        sharding.jit_sharded(upd, (state_shardings, batch, replicated), (state_shardings, replicated),
                             donate_argnums=(0,)),
        rl)


def train_on_batch(fns: UpdateFns, state: TrainState, batch: TrainBatch,
                   ref_params: Params | None = None, place: Callable = jnp.asarray) -> tuple[TrainState, dict]:
    """One train step: prepare, then `ppo_epochs` passes over shuffled mini-batches.

    `place` puts host arrays on the device mesh (default: the default device). Returns the new
    state (step + 1) and host metrics averaged over mini-batches.
    """
    rl = fns.rl
    arrays = {k: v for k, v in batch.arrays().items()}
    bsz = arrays["tokens"].shape[0]
    if bsz % rl.mini_batch_size:
        raise ValueError(f"batch of {bsz} dialogues is not a multiple of config.rl.mini_batch_size="
                         f"{rl.mini_batch_size}")
    device_batch = {k: place(v) for k, v in arrays.items()}
    prepared = fns.prepare(state, ref_params, device_batch)
    full = {k: v for k, v in {**device_batch, **prepared}.items()
            if k not in ("sample_logprobs", "group", "rewards")}  # what the update reads
    # Host-side shuffling, seeded by the step, so resume replays the same order.
    order_rng = np.random.default_rng([int(jax.device_get(state.step)), 0x5EED])
    history = []
    for _ in range(rl.ppo_epochs):
        perm = order_rng.permutation(bsz)
        for start in range(0, bsz, rl.mini_batch_size):
            rows = np.sort(perm[start:start + rl.mini_batch_size]).astype(np.int32)
            state, m = fns.update_minibatch(state, full, rows)
            history.append(m)
    metrics = {k: float(np.mean([jax.device_get(h[k]) for h in history])) for k in history[0]}
    mask = arrays["policy_mask"]
    old_lp = np.asarray(jax.device_get(prepared["old_logprobs"]))
    metrics["logprob_diff_sampler"] = float(np.abs(old_lp - arrays["sample_logprobs"])[mask > 0].mean()) \
        if mask.sum() else 0.0
    return state.replace(step=state.step + 1), metrics

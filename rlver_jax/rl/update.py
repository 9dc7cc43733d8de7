"""The train step's update maths, as pure functions of arrays (rlver_jax.rl.program jits them).

One train step consumes a TrainBatch of dialogues' training rows (a dialogue each, or one per turn
with think_history "drop"; rlver_jax.rl.batch):
  prepare:    old log-probs (actor), reference log-probs (only with a KL term), values (critic),
              token rewards (shaped; minus a KL penalty in "reward" mode) -> advantages (the
              algorithm's estimator, rlver_jax.rl.estimators) and returns; the rows dynamic
              sampling keeps; the off-policy correction's weights or mask from the sampling
              log-probs (`correct_off_policy`, rlver_jax.rl.off_policy);
  actor:      epochs x mini-batches of `actor_update` (the policy loss of `rl.policy_loss`,
              a row of rlver_jax.rl.loss_modes.POLICY_LOSSES, rlver_jax.rl.policy_losses):
              gradients accumulated over micro-batches with exact mini-batch loss weights, then
              one AdamW step each;
  critic:     the same for the critic, on the same prepared inputs and mini-batch order.
With LoRA the state's models are their trainable leaves and every program also reads the one frozen
base (`Frozen`), which is the reference too. Per-token arrays follow rlver_jax.rl.losses
(rlver_jax.rl.logprobs computes them). With packed rows (rlver_jax.rl.packing: a batch carrying
`pack_source`, an order `PackedOrder`) the model passes run on the packed rows and their outputs
come back in the rows' layout, where everything else runs as without packing.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax

from rlver_jax.models import lora as lora_lib
from rlver_jax.models.config import Qwen2Config
from rlver_jax.rl import estimators, losses, off_policy, packing
from rlver_jax.rl.logprobs import PackedRows, token_logprobs, token_values
from rlver_jax.rl.optimizer import Optimizer
from rlver_jax.rl.settings import RLSettings
from rlver_jax.rl.train_state import TrainState, step_keys

Params = Any
NO_LORA = lora_lib.LoraSettings()  # full fine-tuning


@flax.struct.dataclass
class Frozen:
    """The frozen weights a train step reads besides its state: in full fine-tuning the reference
    policy of a KL term (or nothing); with LoRA the one frozen base, which is also the reference.
    `lora` (static) says which. A pytree, so a program takes it as one argument."""

    params: Params | None = None
    lora: lora_lib.LoraSettings = flax.struct.field(pytree_node=False, default=NO_LORA)

    def model(self, cfg: Qwen2Config, trainable: Params) -> Params:
        """A model's whole parameter tree from its trainable leaves (a TrainState's `actor` or
        `critic`): in full fine-tuning `trainable` itself; with LoRA the base (less its LM head for a
        critic, `cfg.value_head`) with the adapters of `trainable` merged in (lora.merge), plus its
        other leaves (a critic's value head). Gradients of a loss of this tree reach only `trainable`."""
        if not self.lora.enabled:
            return trainable
        body = {k: v for k, v in self.params.items() if not (cfg.value_head and k == "lm_head")}
        merged = lora_lib.merge(self.lora, body, trainable)
        return {**merged, **{k: v for k, v in trainable.items() if k not in body}}

    def base(self) -> Frozen:
        """What the model programs read besides their model: LoRA's base; nothing in full fine-tuning
        (a KL term's reference log-probs come prepared)."""
        return self if self.lora.enabled else Frozen(None, self.lora)


def _micro_split(x, n_micro: int):
    return x.reshape((n_micro, x.shape[0] // n_micro) + x.shape[1:])


def _micro_map(fn, n_micro: int, *arrays):
    """fn over micro-batches (bounded activation memory), results concatenated back."""
    out = jax.lax.map(lambda xs: fn(*xs), tuple(_micro_split(a, n_micro) for a in arrays))
    return jax.tree.map(lambda y: y.reshape((-1,) + y.shape[2:]), out)


def dialogue_advantages(advantages: jax.Array, mask: jax.Array, dialogue: jax.Array) -> jax.Array:
    """[estimators.id_bound(rows)] each dialogue's mean advantage over its policy tokens, indexed by its id
    (`batch["dialogue"]`), 0 for an id without policy tokens; for the transcripts, not the loss."""
    m = mask.astype(jnp.float32)
    n = estimators.id_bound(dialogue.shape[0])
    total = jax.ops.segment_sum(jnp.sum(advantages * m, axis=-1), dialogue, n)
    count = jax.ops.segment_sum(jnp.sum(m, axis=-1), dialogue, n)
    return total / jnp.maximum(count, 1.0)


def _model_rows(batch: dict) -> tuple[tuple, Callable, int]:
    """What `prepare`'s model passes run on: (tokens, attention mask or segment ids, scored slots,
    and with packed rows their position ids), the map of their per-token outputs to the batch's
    rows, and the most segments a row holds (qwen2.hidden_states): the batch's rows, or its packed
    rows (`pack_source`, rl.packing)."""
    tokens = batch["tokens"]
    if "pack_source" not in batch:
        return (tokens, batch["attention_mask"], batch["policy_positions"]), lambda x: x, 1
    packed = PackedRows(batch["pack_source"], batch["pack_positions"])
    packed_tokens, segments, ids = packed.inputs(tokens)
    return ((packed_tokens, segments, packed.positions, ids), lambda x: packed.unpack(x, tokens.shape[0]),
            packing.SEGMENTS)


def prepare(rl: RLSettings, actor_cfg: Qwen2Config, critic_cfg: Qwen2Config | None,
            state: TrainState, frozen: Frozen, batch: dict) -> tuple[dict, dict]:
    """Old log-probs, values, advantages and returns for a whole batch (no gradients), and metrics
    (`estimate`). `frozen.params`: the reference policy; with LoRA it is the frozen base (the
    adapters off) that both models read. The model passes run in micro-batches of its rows (or
    packed rows: `_model_rows`)."""
    scored, place, segments = _model_rows(batch)
    n_micro = scored[0].shape[0] // rl.micro_batch_size

    def logprobs(params, t, a, p, *ids):
        return token_logprobs(actor_cfg, params, t, a, positions=p, chunk=rl.logprob_chunk,
                              position_ids=ids[0] if ids else None, max_segments=segments)

    def values(params, t, a, p, *ids):
        del p  # every token's value
        return token_values(critic_cfg, params, t, a, ids[0] if ids else None, segments)

    actor = frozen.model(actor_cfg, state.actor)
    out = {"old_logprobs": place(_micro_map(functools.partial(logprobs, actor), n_micro, *scored))}
    if rl.uses_reference:
        out["ref_logprobs"] = place(_micro_map(functools.partial(logprobs, frozen.params), n_micro, *scored))
    if rl.uses_critic:
        critic = frozen.model(critic_cfg, state.critic)
        out["values"] = place(_micro_map(functools.partial(values, critic), n_micro, *scored))
    estimated, metrics = estimate(rl, batch, out.get("values"), out["old_logprobs"], out.get("ref_logprobs"))
    corrected, off_metrics = correct_off_policy(rl, batch, out["old_logprobs"], estimated.get("policy_mask"))
    return {**out, **estimated, **corrected}, {**metrics, **off_metrics}


def correct_off_policy(rl: RLSettings, batch: dict, old_logprobs: jax.Array, loss_mask: jax.Array | None
                       ) -> tuple[dict, dict]:
    """`rl.off_policy_correction` (rlver_jax.rl.off_policy) from the batch's sampling log-probs to
    `old_logprobs`: the arrays the updates read (`is_weights` when it weighs the policy-gradient loss,
    the `policy_mask` less the rejected tokens when it masks; `loss_mask`: the mask so far, None =
    the batch's) and the off-policy metrics over the batch's policy tokens (off_policy.correction).
    After the advantages: a rejected token leaves the loss, not its dialogue's advantage."""
    mask = batch["policy_mask"]
    kind = rl.off_policy_kind
    weights, keep, metrics = off_policy.correction(
        old_logprobs, batch["sample_logprobs"], mask, mode=rl.off_policy_correction, level=rl.off_policy_level,
        low=rl.off_policy_low, high=rl.off_policy_high)
    out = {}
    if kind.weighs:
        out["is_weights"] = weights
    if kind.masks:
        out["policy_mask"] = (mask if loss_mask is None else loss_mask) * keep.astype(mask.dtype)
    return out, metrics


def estimate(rl: RLSettings, batch: dict, values: jax.Array | None = None, old_logprobs: jax.Array | None = None,
             ref_logprobs: jax.Array | None = None) -> tuple[dict, dict]:
    """The advantages (and returns) of a batch by the algorithm's estimator (rlver_jax.rl.estimators)
    on the token rewards plus DAPO's overlong penalties (`rl.overlong_penalty`;
    estimators.overlong_rewards) and minus a KL penalty ("reward" mode: `old_logprobs` against
    `ref_logprobs`), over the rows dynamic sampling keeps (`rl.dynamic_sampling`; estimators.kept_rows:
    the dropped rows' `policy_mask` is 0 in the output, so no loss reads them; metric
    `filtered_groups`), with turn-level credit mixed in (`rl.turn_credit_weight`). `values`: the
    critic's (with one). Returns (arrays for the updates, metrics)."""
    mask, group, dialogue = batch["policy_mask"], batch["group"], batch["dialogue"]
    out, metrics = {}, {}
    rewards, loss_mask = batch["rewards"], mask
    if rl.dynamic_sampling:
        keep, metrics["filtered_groups"] = estimators.kept_rows(rewards, mask, group, dialogue)
        loss_mask = out["policy_mask"] = mask * keep[:, None].astype(mask.dtype)
    if rl.overlong_penalty:
        rewards = rewards + estimators.overlong_rewards(rl, mask, batch["turn"], dialogue)
    if rl.uses_reference and rl.kl_mode == "reward":
        rewards = losses.apply_kl_penalty(rewards, old_logprobs, ref_logprobs, mask, coef=rl.kl_coef,
                                          estimator=rl.kl_estimator)
    x = estimators.EstimatorInputs(rewards, loss_mask, values, group, dialogue)
    advantages, returns = rl.estimator_kind.function(rl, x)
    if rl.turn_credit_weight:
        advantages = estimators.turn_credit(rl, advantages, loss_mask, group, batch["turn"], batch["turn_rewards"],
                                            batch["turn_scored"])
    if returns is not None:
        out["returns"] = returns
    out["advantages"] = advantages
    return out, metrics


def _packed(mb: dict) -> PackedRows | None:
    """A micro-batch's packed rows (`micro_batches`), None when it runs unpacked."""
    return PackedRows(mb["pack_source"], mb["pack_positions"]) if "pack_source" in mb else None


def _actor_loss(rl: RLSettings, cfg: Qwen2Config, params, mb):
    if (packed := _packed(mb)) is None:
        lp, ent = token_logprobs(cfg, params, mb["tokens"], mb["attention_mask"], with_entropy=True,
                                 positions=mb["policy_positions"], chunk=rl.logprob_chunk)
    else:
        lp, ent = packed.logprobs(cfg, params, mb["tokens"], with_entropy=True, chunk=rl.logprob_chunk)
    mask, w = mb["policy_mask"], mb["weights"]
    pg, pg_metrics = rl.policy_loss_kind.function(rl, lp, mb["old_logprobs"], mb["advantages"], mask)
    if rl.off_policy_kind.weighs:  # the correction to the sampling policy (correct_off_policy)
        pg = pg * mb["is_weights"]
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
    if (packed := _packed(mb)) is None:
        values = token_values(cfg, params, mb["tokens"], mb["attention_mask"])
    else:
        values = packed.values(cfg, params, mb["tokens"])
    vl, vl_metrics = losses.value_loss(values, mb["values"], mb["returns"], mb["policy_mask"],
                                       clip_range=rl.value_clip)
    w = mb["value_weights"]
    frac = jnp.sum(w)
    return jnp.sum(vl * w), {"value_loss": jnp.sum(vl * w), **{k: v * frac for k, v in vl_metrics.items()}}


class PackedOrder(NamedTuple):
    """The update's mini-batch order with each micro-batch's packed rows (rlver_jax.rl.packing.micro_layouts):
    rows [S, R] (`minibatch_rows`), source [S, M, P, T] and positions [S, M, P, C] (logprobs.PackedRows)
    of the M micro-batches of each of the S mini-batches."""

    rows: jax.Array
    source: jax.Array
    positions: jax.Array


def micro_batches(rl: RLSettings, batch: dict, rows: jax.Array, packed: PackedRows | None = None) -> dict:
    """The mini-batch `batch[rows]` with its loss weights, as [micro-batches, micro_batch_size, ...],
    and with `packed` ([micro-batches, P, ...]) each micro-batch's packed rows. The rows are gathered
    inside the program, so the batch stays on the mesh."""
    mb = {k: v[rows] for k, v in batch.items()}
    # seq_mean_token_sum_norm's constant: a policy turn's token budget
    mb["weights"] = losses.loss_weights(mb["policy_mask"], rl.loss_agg_mode, norm_len=rl.max_new_tokens)
    mb["value_weights"] = losses.loss_weights(mb["policy_mask"], rl.value_loss_agg_mode, norm_len=rl.max_new_tokens)
    n_micro = mb["tokens"].shape[0] // rl.micro_batch_size
    mb = jax.tree.map(lambda x: _micro_split(x, n_micro), mb)
    if packed is not None:
        mb["pack_source"], mb["pack_positions"] = packed
    return mb


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


def actor_update(rl: RLSettings, cfg: Qwen2Config, tx, params: Params, opt_state, frozen: Frozen, micro: dict,
                 lr: jax.Array):
    """The actor's optimizer step on one mini-batch (`micro_batches`) at learning rate `lr`: (params,
    opt_state, metrics). `params`: its trainable leaves (`Frozen.model`)."""
    loss = lambda p, x: _actor_loss(rl, cfg, frozen.model(cfg, p), x)
    return _optimizer_step("actor", loss, tx, params, opt_state, micro, lr)


def critic_update(rl: RLSettings, cfg: Qwen2Config, tx, params: Params, opt_state, frozen: Frozen, micro: dict,
                  lr: jax.Array):
    """The critic's optimizer step on one mini-batch (`micro_batches`) at learning rate `lr`: (params,
    opt_state, metrics). `params`: its trainable leaves (`Frozen.model`)."""
    loss = lambda p, x: _critic_loss(rl, cfg, frozen.model(cfg, p), x)
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
    only = ("sample_logprobs", "group", "dialogue", "rewards", "turn", "turn_rewards", "turn_scored", "pack_source",
            "pack_positions")
    return {k: v for k, v in {**batch, **prepared}.items() if k not in only}


def prepare_step(rl: RLSettings, actor_cfg: Qwen2Config, critic_cfg: Qwen2Config | None, models: TrainState,
                 frozen: Frozen, batch: dict) -> tuple[dict, jax.Array, dict, jax.Array]:
    """The train step's first program: `prepare` on the batch, the arrays the updates read
    (`update_inputs`), the step's mini-batch rows (`step_keys(state.rng, state.step).order`), its
    metrics (with the sampler's agreement, `correct_off_policy`) and each dialogue's advantage
    (`dialogue_advantages`). `models` is the state without its optimizer states (unread). Rows
    without policy tokens to train on (padding, and the rows dynamic sampling drops) go last in the
    mini-batch order."""
    prepared, metrics = prepare(rl, actor_cfg, critic_cfg, models, frozen, batch)
    inputs = update_inputs(batch, prepared)
    mask = batch["policy_mask"]
    rows = minibatch_rows(rl, step_keys(models.rng, models.step).order, mask.shape[0],
                          jnp.sum(inputs["policy_mask"], -1) == 0)
    advantages = dialogue_advantages(prepared["advantages"], mask, batch["dialogue"])
    return inputs, rows, metrics, advantages


def model_epochs(name: str, rl: RLSettings, update: Callable, opt: Optimizer, step: jax.Array, params: Params,
                 opt_state, frozen: Frozen, inputs: dict, rows: jax.Array | PackedOrder) -> tuple[Params, Any, dict]:
    """One model's program of a train step: `ppo_epochs` x mini-batches of `update(params,
    opt_state, frozen, micro, lr) -> (params, opt_state, metrics)` (actor_update or critic_update;
    `frozen`: `Frozen.base`) in the order
    `rows` (a `PackedOrder`: with its micro-batches' packed rows), all at the train step's learning rate;
    a mini-batch of padding rows only (the processes of a
    multi-host run pad to the most rows any of them holds) is skipped. Metrics are means over the
    mini-batches run, with `{name}_lr`, `optimizer_steps` (those run, all epochs) and the parameter norm
    after the step. The actor's and the critic's programs read the same prepared inputs and not each
    other's parameters, so running one after the other is PPO's joint update exactly."""
    lr = jnp.asarray(opt.learning_rate(step), jnp.float32)

    def run(carry, r):
        mini = (micro_batches(rl, inputs, r) if not isinstance(r, PackedOrder)
                else micro_batches(rl, inputs, r.rows, PackedRows(r.source, r.positions)))
        p, o, m = update(*carry, frozen, mini, lr)
        return (p, o), m

    def body(carry, r):
        zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(run, carry, r)[1])
        real = jnp.any(inputs["policy_mask"][r.rows if isinstance(r, PackedOrder) else r] > 0)
        carry, m = jax.lax.cond(real, run, lambda c, _: (c, zeros), carry, r)
        return carry, (m, real.astype(jnp.float32))

    (params, opt_state), (history, real) = jax.lax.scan(body, (params, opt_state), rows)
    steps = jnp.sum(real)
    metrics = jax.tree.map(lambda x: jnp.sum(x * real, axis=0) / jnp.maximum(steps, 1.0), history)
    metrics.update({f"{name}_lr": lr, "optimizer_steps": steps})
    metrics[f"{name}_param_norm"] = optax.global_norm(params)
    return params, opt_state, metrics

"""Advantage estimation for RLVER: GAE over policy tokens, GRPO group advantages, whitening.

Shapes: B training rows (a dialogue each, or a turn each with think_history "drop"), T tokens,
N rows in a GRPO batch.
Every per-token array is aligned to the token it describes:
  mask[b, t]     1 exactly on policy-generated tokens (several assistant turns per row; user and
                 template tokens in between, and right padding, are 0), float or bool;
  rewards[b, t]  token-level reward; rewards live on policy tokens only (the final emotion / 100 on
                 the last policy token, or per turn on each turn's last policy token);
  values[b, t]   the critic's value of the state just before token t is emitted.
All functions are pure jnp and jit-friendly.
"""

import jax
import jax.numpy as jnp

Array = jax.Array


def _float(x: Array) -> Array:
    """Promotes to at least fp32: advantage statistics must not run in bf16."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def masked_mean(x: Array, mask: Array, axis: int | None = None) -> Array:
    """sum(x * m) / max(sum(m), 1) over `axis` (all axes when None); 0 where nothing is selected."""
    x = _float(x)
    m = jnp.asarray(mask).astype(x.dtype)
    return jnp.sum(x * m, axis=axis) / jnp.maximum(jnp.sum(m, axis=axis), 1.0)


def masked_var(x: Array, mask: Array, axis: int | None = None, *, ddof: int = 0) -> Array:
    """sum(m * (x - mean)^2) / max(sum(m) - ddof, 1): the variance of the selected entries."""
    x = _float(x)
    m = jnp.asarray(mask).astype(x.dtype)
    mean = masked_mean(x, m, axis)
    centered = x - (mean if axis is None else jnp.expand_dims(mean, axis))
    count = jnp.sum(m, axis=axis)
    return jnp.sum(m * centered**2, axis=axis) / jnp.maximum(count - ddof, 1.0)


def masked_whiten(x: Array, mask: Array, shift_mean: bool = True, eps: float = 1e-8) -> Array:
    """(x - mean) / sqrt(var + eps) over the selected entries of the whole array; 0 elsewhere.

    mean and var are taken over entries where mask is set; var is the unbiased (ddof=1) sample
    variance, as verl's masked_whiten. With shift_mean=False the mean is added back, so only the
    scale changes.
    """
    x = _float(x)
    m = jnp.asarray(mask).astype(x.dtype)
    mean = masked_mean(x, m)
    whitened = (x - mean) * jax.lax.rsqrt(masked_var(x, m, ddof=1) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * m


def gae_advantages(
    rewards: Array, values: Array, mask: Array, gamma: float | Array, lam: float | Array
) -> tuple[Array, Array]:
    """Generalised advantage estimation over the policy tokens of each row, [B, T] -> 2 x [B, T].

    The policy tokens of a row, in order t_1 < ... < t_K, form one trajectory; tokens with
    mask == 0 are skipped entirely, so a multi-turn dialogue is credited as a single episode:
      delta_k = r[t_k] + gamma * V[t_{k+1}] - V[t_k]      (V[t_{K+1}] = 0: terminal)
      A[t_k]  = delta_k + gamma * lam * A[t_{k+1}]        (A[t_{K+1}] = 0)
      R[t_k]  = A[t_k] + V[t_k]                           (lambda-return, the critic's target)
    Advantages and returns are 0 where mask == 0. Rewards must be placed on policy tokens: a
    reward on a masked-out position is not part of any action and is ignored.
    """
    rewards, values = _float(rewards), _float(values)
    dtype = jnp.promote_types(rewards.dtype, values.dtype)
    rewards, values = rewards.astype(dtype), values.astype(dtype)
    is_policy = jnp.asarray(mask).astype(bool)

    def step(carry, xs):
        next_value, next_adv = carry
        r, v, m = xs
        adv = r + gamma * next_value - v + gamma * lam * next_adv
        # Non-policy tokens pass the carry through unchanged, linking turn k's last token to turn
        # k+1's first token.
        carry = (jnp.where(m, v, next_value), jnp.where(m, adv, next_adv))
        return carry, jnp.where(m, adv, 0.0)

    batch = rewards.shape[0]
    init = (jnp.zeros((batch,), dtype), jnp.zeros((batch,), dtype))
    # Scan over time, so the per-step slices are [B].
    _, adv_TB = jax.lax.scan(step, init, (rewards.T, values.T, is_policy.T), reverse=True)
    advantages = adv_TB.T
    returns = jnp.where(is_policy, advantages + values, 0.0)
    return advantages, returns


def grpo_advantages(
    scores: Array,
    group_ids: Array,
    num_groups: int,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
    members: Array | None = None,
) -> Array:
    """Group-relative outcome advantage per sequence, [N] -> [N].

    Sequence i belongs to group g = group_ids[i] (the n rollouts of one profile share an id in
    [0, num_groups); any order, groups may differ in size, e.g. when a dialogue was dropped):
      A_i = (s_i - mean_g) / (std_g + eps)   if normalize_std, else   A_i = s_i - mean_g
    where mean_g and std_g (the sample standard deviation, ddof=1) are taken over the group's
    `members` (bool [N]; default every sequence). With one row per dialogue turn, the members
    are each dialogue's first row, so the statistics run over dialogues, not turn rows. A group
    of identical scores, or of one member (no baseline), gets A = 0 exactly. num_groups must be
    static under jit.
    """
    scores = _float(scores)
    group_ids = jnp.asarray(group_ids)
    m = jnp.ones_like(scores) if members is None else jnp.asarray(members).astype(scores.dtype)
    count = jax.ops.segment_sum(m, group_ids, num_groups)
    # Offsets from a member of the group are exactly 0 for identical scores, so such a group
    # gets A = 0 exactly; summing the raw scores would leave rounding noise that the std
    # normalisation then blows up.
    anchor = jax.ops.segment_max(jnp.where(m > 0, scores, -jnp.inf), group_ids, num_groups)
    offset = scores - jnp.where(count > 0, anchor, 0.0)[group_ids]
    mean_offset = jax.ops.segment_sum(offset * m, group_ids, num_groups) / jnp.maximum(count, 1.0)
    # A row whose group has no member has no baseline either.
    centered = jnp.where(count[group_ids] > 0, offset - mean_offset[group_ids], 0.0)
    if not normalize_std:
        return centered
    sq = jax.ops.segment_sum(centered**2 * m, group_ids, num_groups)
    # max(count - 1, 1): a group of one has std 0 instead of 0 / 0.
    std = jnp.sqrt(sq / jnp.maximum(count - 1.0, 1.0))[group_ids]
    # std == 0 only where every centered score is 0; keep A = 0 there even with eps = 0.
    return centered / jnp.where(std > 0, std + eps, 1.0)


def broadcast_to_tokens(seq_advantages: Array, mask: Array) -> Array:
    """A[b, t] = seq_advantages[b] * mask[b, t]: one outcome advantage on every policy token."""
    seq_advantages = _float(seq_advantages)
    return seq_advantages[:, None] * jnp.asarray(mask).astype(seq_advantages.dtype)

"""Policy-gradient loss terms (PPO, GSPO, CISPO), clipped value loss, entropy, KL, aggregation.

Shapes: B sequences, T tokens, V vocabulary. Per-token arrays are aligned to the token they
describe (logprobs[b, t] = log pi(token_t | tokens_<t)); mask[b, t] is 1 exactly on policy tokens.
Per-token terms are returned unreduced and reduced with `aggregate_loss`, so every term uses the
same aggregation mode. Hyperparameters (clip ranges, coefficients, mode names) are Python values
taken from the config, static under jit.
"""

import jax
import jax.numpy as jnp

from rlver_jax.rl.advantages import masked_mean
from rlver_jax.rl.loss_modes import AGG_MODES, KL_ESTIMATORS

Array = jax.Array

# verl's numerical guards: the log-ratio is clamped before exp (exp(20) ~ 5e8 keeps fp32 finite),
# and a k3 KL estimate is clamped at 10; GSPO's token ratio is clamped above at exp(10).
LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0
GSPO_LOG_RATIO_MAX = 10.0


def _f32(x: Array) -> Array:
    return jnp.asarray(x).astype(jnp.float32)


def kl_k1(logprobs: Array, ref_logprobs: Array) -> Array:
    """k1 = logp - ref_logp: unbiased estimate of KL(pi || ref) at tokens sampled from pi."""
    return _f32(logprobs) - _f32(ref_logprobs)


def kl_k3(logprobs: Array, ref_logprobs: Array) -> Array:
    """k3 = exp(d) - d - 1 with d = ref_logp - logp: unbiased, non-negative, low variance.

    As verl's low_var_kl: d is clamped to [-20, 20] before exp and k3 to [-10, 10].
    """
    log_ratio = jnp.clip(_f32(ref_logprobs) - _f32(logprobs), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return jnp.clip(jnp.exp(log_ratio) - log_ratio - 1.0, -K3_CLAMP, K3_CLAMP)


def kl_divergence(logprobs: Array, ref_logprobs: Array, estimator: str) -> Array:
    """Per-token estimate of KL(pi || ref) by the named estimator of loss_modes.KL_ESTIMATORS."""
    return KL_ESTIMATORS.row(estimator)(logprobs, ref_logprobs)


def apply_kl_penalty(
    rewards: Array,
    logprobs: Array,
    ref_logprobs: Array,
    mask: Array,
    *,
    coef: float,
    estimator: str = "k1",
) -> Array:
    """r'[b, t] = r[b, t] - coef * KL[b, t] * mask[b, t]: KL to the reference as a reward penalty.

    The penalty is data for the advantage estimate, so no gradient flows through it.
    """
    kl = jax.lax.stop_gradient(kl_divergence(logprobs, ref_logprobs, estimator))
    return _f32(rewards) - coef * kl * _f32(mask)


def ppo_policy_loss(
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    mask: Array,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Per-token PPO clipped surrogate loss [B, T] and metrics.

      rho  = exp(clip(logp - old_logp, -20, 20))   (the clamp as verl's)
      L    = max(-A * rho, -A * clip(rho, 1 - clip_eps_low, 1 + clip_eps_high))
      L    = min(L, -A * dual_clip)   where A < 0 (dual clip, dual_clip > 1; off when None)
    The dual clip bounds the loss of a negative-advantage token whose ratio has grown large, which
    the ordinary clip leaves unbounded. Metrics are means over policy tokens: `clip_frac` (the
    clipped branch is taken), `dual_clip_frac`, and `approx_kl` (k3 estimate of KL(old || new)).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got {dual_clip}")
    logprobs, old_logprobs, advantages = _f32(logprobs), _f32(old_logprobs), _f32(advantages)
    ratio = jnp.exp(jnp.clip(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    loss = jnp.maximum(unclipped, clipped)
    metrics = {
        "clip_frac": masked_mean(clipped > unclipped, mask),
        # Samples come from the old policy, so KL(old || new) is k3 with old as the sampler.
        "approx_kl": masked_mean(kl_k3(old_logprobs, logprobs), mask),
    }
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual_active = (advantages < 0) & (loss > bound)
        loss = jnp.where(dual_active, bound, loss)
        metrics["dual_clip_frac"] = masked_mean(dual_active, mask)
    return loss, metrics


def value_loss(
    values: Array,
    old_values: Array,
    returns: Array,
    mask: Array,
    *,
    clip_range: float,
) -> tuple[Array, dict[str, Array]]:
    """Per-token clipped value loss [B, T] and metrics.

      V_clip = clip(V, old_V - clip_range, old_V + clip_range)
      L      = 0.5 * max((V - R)^2, (V_clip - R)^2)
    Metric `vf_clip_frac`: share of policy tokens where the clipped error is the larger one.
    V_clip is computed as verl does: clipping V itself leaves V_clip == V bit for bit inside the
    range, whereas old_V + clip(V - old_V) rounds there and counts ~0.7% of unclipped tokens as
    clipped in float32.
    """
    values, old_values, returns = _f32(values), _f32(old_values), _f32(returns)
    clipped_values = jnp.clip(values, old_values - clip_range, old_values + clip_range)
    err_unclipped = (values - returns) ** 2
    err_clipped = (clipped_values - returns) ** 2
    loss = 0.5 * jnp.maximum(err_unclipped, err_clipped)
    return loss, {"vf_clip_frac": masked_mean(err_clipped > err_unclipped, mask)}


def entropy_from_logits(logits: Array) -> Array:
    """H = -sum_v p_v log p_v over the last axis, in fp32: [..., V] -> [...].

    Entries with p = 0 (logits of -inf, e.g. masked-out vocabulary) contribute 0, with a finite
    gradient.
    """
    logp = jax.nn.log_softmax(_f32(logits), axis=-1)
    p = jnp.exp(logp)
    # where() before the product: 0 * -inf would be NaN in the value and in the gradient.
    return -jnp.sum(p * jnp.where(p > 0, logp, 0.0), axis=-1)


def gspo_policy_loss(
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    mask: Array,
    *,
    clip_eps_low: float = 3e-4,
    clip_eps_high: float = 4e-4,
) -> tuple[Array, dict[str, Array]]:
    """Per-token GSPO-token loss [B, T] and metrics (Zheng et al. 2025, arXiv:2507.18071).

    The importance ratio is the sequence's, length-normalised, with the gradient per token:
      log s_b     = sum_t m (logp - old_logp) / sum_t m          (a row's policy tokens)
      s_b,t       = exp(min(sg(log s_b) + logp_t - sg(logp_t), 10))   (value s_b; clamp as verl's)
      L[b, t]     = max(-A s_b,t, -A clip(s_b,t, 1 - clip_eps_low, 1 + clip_eps_high))
    so dL/dlogp_t = -A[b, t] s_b where the ratio is not clipped and 0 where it is (verl
    compute_policy_loss_gspo). Aggregated with loss_modes.GSPO_AGG_MODES (the mean over sequences of the
    token mean) and with one advantage per sequence, this is GSPO's sequence-level objective in
    value and in gradient. The defaults are the paper's clip range. Metrics as ppo_policy_loss:
    `clip_frac` (share of policy tokens on the clipped branch) and `approx_kl` (token-level k3
    of KL(old || new)).
    """
    logprobs, old_logprobs, advantages = _f32(logprobs), _f32(old_logprobs), _f32(advantages)
    m = _f32(mask)
    # where(), not a product: log-probs off the policy tokens must not reach the sequence mean.
    log_ratio = jnp.where(m > 0, logprobs - old_logprobs, 0.0)
    log_seq_ratio = jnp.sum(log_ratio, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)
    log_token_ratio = (jax.lax.stop_gradient(log_seq_ratio)[:, None] + logprobs
                       - jax.lax.stop_gradient(logprobs))
    ratio = jnp.exp(jnp.minimum(log_token_ratio, GSPO_LOG_RATIO_MAX))
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    metrics = {
        "clip_frac": masked_mean(clipped > unclipped, mask),
        "approx_kl": masked_mean(kl_k3(old_logprobs, logprobs), mask),
    }
    return jnp.maximum(unclipped, clipped), metrics


def cispo_policy_loss(
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    mask: Array,
    *,
    clip_eps_high: float,
    clip_eps_low: float | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Per-token CISPO loss [B, T] and metrics (MiniMax-M1, arXiv:2506.13585, Eq. 4-5).

      rho     = exp(clip(logp - old_logp, -20, 20))
      w       = sg(min(rho, 1 + clip_eps_high))      (also max(., 1 - clip_eps_low) if given)
      L[b, t] = -w * A * logp
    The importance weight is truncated and carries no gradient, so every token keeps a gradient
    dL/dlogp = -w * A (PPO's clip zeroes it). The paper sets no lower bound (clip_eps_low None);
    verl compute_policy_loss_cispo always clamps to [1 - low, 1 + high]. The loss value is a
    surrogate for its gradient only. Metrics: `clip_frac` (share of policy tokens whose weight was
    truncated) and `approx_kl` (k3 estimate of KL(old || new)).
    """
    logprobs, old_logprobs, advantages = _f32(logprobs), _f32(old_logprobs), _f32(advantages)
    ratio = jnp.exp(jnp.clip(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    lower = -jnp.inf if clip_eps_low is None else 1.0 - clip_eps_low
    weight = jax.lax.stop_gradient(jnp.clip(ratio, lower, 1.0 + clip_eps_high))
    metrics = {
        "clip_frac": masked_mean(weight != ratio, mask),
        "approx_kl": masked_mean(kl_k3(old_logprobs, logprobs), mask),
    }
    return -weight * advantages * logprobs, metrics


def token_mean_weights(mask: Array, norm_len: float | None) -> Array:
    """`aggregate_loss`'s token_mean as weights (loss_modes.AGG_MODES)."""
    del norm_len  # only seq_mean_token_sum_norm reads it
    m = _f32(mask)
    return m / jnp.maximum(jnp.sum(m), 1.0)


def _mask_and_num_rows(mask: Array) -> tuple[Array, Array]:
    """(mask [B, T] in fp32, the number of rows with a policy token): batch padding rows, without
    policy tokens, are left out of a mean over sequences."""
    m = _f32(mask)
    return m, jnp.maximum(jnp.sum(jnp.any(m > 0, axis=-1)), 1.0)


def seq_mean_token_mean_weights(mask: Array, norm_len: float | None) -> Array:
    """`aggregate_loss`'s seq_mean_token_mean as weights (loss_modes.AGG_MODES)."""
    del norm_len  # only seq_mean_token_sum_norm reads it
    m, num_rows = _mask_and_num_rows(mask)
    return m / jnp.maximum(jnp.sum(m, axis=-1, keepdims=True), 1.0) / num_rows


def seq_mean_token_sum_norm_weights(mask: Array, norm_len: float | None) -> Array:
    """`aggregate_loss`'s seq_mean_token_sum_norm as weights (loss_modes.AGG_MODES)."""
    m, num_rows = _mask_and_num_rows(mask)
    return m / num_rows / (mask.shape[-1] if norm_len is None else norm_len)


def loss_weights(mask: Array, mode: str, *, norm_len: float | None = None) -> Array:
    """Per-token weights w [B, T] with sum_{b,t} w L = the aggregated loss (see aggregate_loss).

    Computed once over a whole mini-batch and then split into micro-batches, so gradient
    accumulation gives exactly the mini-batch loss. `norm_len` is read by seq_mean_token_sum_norm
    only: its constant normaliser (None: the mini-batch's padded length T).
    """
    return AGG_MODES.row(mode)(mask, norm_len)


def aggregate_loss(
    per_token: Array, mask: Array, mode: str, *, norm_len: float | None = None
) -> Array:
    """Reduces a per-token loss [B, T] to a scalar over policy tokens.

      token_mean:              sum_{b,t} m L / sum_{b,t} m      (every token weighs the same)
      seq_mean_token_mean:     mean_b [sum_t m L / sum_t m]     (every dialogue weighs the same)
      seq_mean_token_sum_norm: mean_b [sum_t m L] / norm_len    (Dr.GRPO: a token's weight depends
                                                               on neither its row's length nor
                                                               the batch's token count)
    The means over rows skip rows without policy tokens (batch padding). seq_mean_token_sum_norm
    is verl agg_loss's "seq-mean-token-sum-norm" (Liu et al. 2025, Dr.GRPO, arXiv:2503.20783):
    verl divides by loss_scale_factor, or by the padded response length when unset; norm_len None
    takes the padded length T of `mask`, which changes with the batch's length bucket, so set it
    to a constant (such as the generation budget) for a constant scale.
    """
    return jnp.sum(_f32(per_token) * loss_weights(mask, mode, norm_len=norm_len))

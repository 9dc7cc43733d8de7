"""PPO / GRPO loss terms: clipped surrogate, clipped value loss, entropy, KL, aggregation.

Shapes: B sequences, T tokens, V vocabulary. Per-token arrays are aligned to the token they
describe (logprobs[b, t] = log pi(token_t | tokens_<t)); mask[b, t] is 1 exactly on policy tokens.
Per-token terms are returned unreduced and reduced with `aggregate_loss`, so every term uses the
same aggregation mode. Hyperparameters (clip ranges, coefficients, mode names) are Python values
taken from the config, static under jit.
"""

from typing import Callable

import jax
import jax.numpy as jnp

from rlver_jax.rl.advantages import masked_mean

Array = jax.Array

# verl's numerical guards: the log-ratio is clamped before exp (exp(20) ~ 5e8 keeps fp32 finite),
# and a k3 KL estimate is clamped at 10.
LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


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


KL_ESTIMATORS: dict[str, Callable[[Array, Array], Array]] = {"k1": kl_k1, "k3": kl_k3}


def kl_divergence(logprobs: Array, ref_logprobs: Array, estimator: str) -> Array:
    """Per-token estimate of KL(pi || ref) by the named estimator of KL_ESTIMATORS."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; valid: {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[estimator](logprobs, ref_logprobs)


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


def _token_mean_weights(mask: Array) -> Array:
    m = _f32(mask)
    return m / jnp.maximum(jnp.sum(m), 1.0)


def _seq_mean_token_mean_weights(mask: Array) -> Array:
    m = _f32(mask)
    per_row = jnp.sum(m, axis=-1, keepdims=True)
    # Rows without policy tokens (batch padding) are left out of the mean over sequences.
    num_rows = jnp.sum(per_row > 0)
    return m / jnp.maximum(per_row, 1.0) / jnp.maximum(num_rows, 1.0)


AGG_MODES: dict[str, Callable[[Array], Array]] = {
    "token_mean": _token_mean_weights,
    "seq_mean_token_mean": _seq_mean_token_mean_weights,
}


def loss_weights(mask: Array, mode: str) -> Array:
    """Per-token weights w [B, T] with sum_{b,t} w L = the aggregated loss (see aggregate_loss).

    Computed once over a whole mini-batch and then split into micro-batches, so gradient
    accumulation gives exactly the mini-batch loss.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid: {sorted(AGG_MODES)}")
    return AGG_MODES[mode](mask)


def aggregate_loss(per_token: Array, mask: Array, mode: str) -> Array:
    """Reduces a per-token loss [B, T] to a scalar over policy tokens.

      token_mean:           sum_{b,t} m L / sum_{b,t} m          (every token weighs the same)
      seq_mean_token_mean:  mean_b [sum_t m L / sum_t m]         (every dialogue weighs the same;
                                                                  rows with no policy token skipped)
    """
    return jnp.sum(_f32(per_token) * loss_weights(mask, mode))

"""Off-policy correction: the policy-gradient loss reweighted, or masked, by how far the policy that
sampled a token is from the one the update starts from.

Three policies meet in a train step (verl's "three-policy" decoupled PPO, AReaL's decoupled PPO):
pi_sample, the actor version that generated the batch (its log-probs are recorded with each token,
`DialogueSequence.logprobs`, under the unmodified model: temperature 1, no top-k/top-p, as the
trainer computes them); pi_old, the actor at the start of the update (its log-probs are recomputed
in `update.prepare`: the proximal policy the PPO clip is taken around); and pi_theta, the actor being
updated. With config.rollout.max_staleness > 0 pi_sample is an older version than pi_old, and even
on-policy the sampler's arithmetic may differ from the trainer's (KV caches, batch shapes,
precision). The importance ratio of a token is

  token level:    rho[b, t] = exp(clip(logp_old[b, t] - logp_sample[b, t], -20, 20))
  sequence level: rho[b, t] = exp(clip(sum_t' m[b, t'] (logp_old - logp_sample)[b, t'], -20, 20))
                  (the row's product of token ratios, on every token of row b; a row is a dialogue,
                  or one turn with think_history "drop")

(the clamp is verl's SAFETY_BOUND) and `config.rl.off_policy_correction` turns it into a factor w
on each token's policy-gradient loss (data: no gradient flows through it) and a mask of the tokens
kept in the loss:

  none:       w = 1                          the update of before, bit for bit
  tis:        w = min(rho, C_high)           truncated IS; verl compute_rollout_correction_weights
                                             (rollout_is = token | sequence, rollout_is_threshold)
  mis:        keep = C_low <= rho <= C_high  masked IS by rejection; verl compute_rollout_rejection_mask
                                             (rollout_rs = token | sequence): rejected tokens leave the
                                             loss mask (the critic's too, as verl's response mask), so
                                             they leave the aggregation's denominators too
  icepop:     w = rho 1[C_low <= rho <= C_high]   IcePop's two-sided token mask (Ring-1T, "Small Leak
                                             Can Sink a Great Ship"): the ratio inside the band, 0 outside;
                                             masked tokens stay in the denominators, as in the paper
  decoupled:  w = rho 1[rho <= C_high]       AReaL's decoupled PPO loss (ppo_actor_loss_fn with
                                             use_decoupled_loss; behav_imp_weight_cap = C_high, inf: no cap)

The PPO (or GSPO, CISPO) loss keeps its own ratio pi_theta / pi_old, so in every mode the clip is
around the proximal policy and w corrects from the proximal policy to the sampling policy. Shapes:
B rows, T tokens; arrays as rlver_jax.rl.losses.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rlver_jax.rl.advantages import masked_mean
from rlver_jax.rl.loss_modes import CORRECTIONS, LEVELS

Array = jax.Array

LOG_RATIO_CLAMP = 20.0  # verl's SAFETY_BOUND: exp(20) ~ 5e8 keeps fp32 finite


# The corrections, each (rho [B, T], C_low, C_high) -> (w, keep, truncated), all [B, T]; an absent
# bound is -inf or inf. Each is the function of a row of loss_modes.CORRECTIONS.

def unchanged(rho_BT: Array, low: float, high: float) -> tuple[Array, Array, Array]:
    """none: w = 1, every token kept."""
    del low, high
    return jnp.ones_like(rho_BT), jnp.ones(rho_BT.shape, bool), jnp.zeros(rho_BT.shape, bool)


def truncated(rho_BT: Array, low: float, high: float) -> tuple[Array, Array, Array]:
    """tis: w = min(rho, C_high)."""
    del low
    return jnp.minimum(rho_BT, high), jnp.ones(rho_BT.shape, bool), rho_BT > high


def rejected(rho_BT: Array, low: float, high: float) -> tuple[Array, Array, Array]:
    """mis: keep = C_low <= rho <= C_high, w = 1."""
    return jnp.ones_like(rho_BT), (rho_BT >= low) & (rho_BT <= high), jnp.zeros(rho_BT.shape, bool)


def banded(rho_BT: Array, low: float, high: float) -> tuple[Array, Array, Array]:
    """icepop, decoupled: w = rho inside [C_low, C_high], 0 outside."""
    inside_BT = (rho_BT >= low) & (rho_BT <= high)
    return jnp.where(inside_BT, rho_BT, 0.0), jnp.ones(rho_BT.shape, bool), jnp.zeros(rho_BT.shape, bool)


def log_ratios(old_logprobs: Array, sample_logprobs: Array, mask: Array, level: str) -> Array:
    """[B, T] log rho at `level` (module docstring), clamped to [-20, 20]; 0 off the policy tokens
    at token level (padding log-probs never reach a sum)."""
    diff_BT = jnp.where(jnp.asarray(mask) > 0,
                        old_logprobs.astype(jnp.float32) - sample_logprobs.astype(jnp.float32), 0.0)
    if level == "sequence":
        diff_BT = jnp.broadcast_to(jnp.sum(diff_BT, axis=-1, keepdims=True), diff_BT.shape)
    elif level != "token":
        raise ValueError(f"unknown off-policy level {level!r}; valid: {LEVELS}")
    return jnp.clip(diff_BT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def correction(old_logprobs: Array, sample_logprobs: Array, mask: Array, *, mode: str, level: str = "token",
               low: float | None = None, high: float | None = None) -> tuple[Array, Array, dict[str, Array]]:
    """(w [B, T], keep [B, T] (bool), metrics) of `mode` (module docstring) with the band [low,
    high] (`low` None: no lower bound, `high` None: none at all). Metrics are over the policy tokens
    of `mask`: `offpolicy_weight_mean` and `offpolicy_weight_max`, the ratio rho before truncation
    or masking (verl's rollout_is_mean / _max); `offpolicy_clipped_frac`, the share truncated (tis);
    `offpolicy_masked_frac`, the share whose loss is dropped (w = 0 or keep = 0);
    `logprob_diff_sampler`, the mean |logp_old - logp_sample|."""
    row = CORRECTIONS.row(mode)
    rho_BT = jnp.exp(log_ratios(old_logprobs, sample_logprobs, mask, level))
    lower = -math.inf if low is None else low
    upper = math.inf if high is None else high
    weight_BT, keep_BT, clipped_BT = row.function(rho_BT, lower, upper)
    policy_BT = jnp.asarray(mask) > 0
    metrics = {
        "logprob_diff_sampler": masked_mean(jnp.abs(old_logprobs - sample_logprobs), mask),
        "offpolicy_weight_mean": masked_mean(rho_BT, policy_BT),
        "offpolicy_weight_max": jnp.max(jnp.where(policy_BT, rho_BT, 0.0)),
        "offpolicy_clipped_frac": masked_mean(clipped_BT, policy_BT),
        "offpolicy_masked_frac": masked_mean(~keep_BT | (weight_BT == 0), policy_BT),
    }
    return weight_BT, keep_BT, metrics

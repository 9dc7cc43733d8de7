"""The policy losses `config.rl.policy_loss` names, each (rl, logprobs, old_logprobs, advantages,
mask) -> (per-token loss [B, T], metrics): the knobs each reads from RLSettings, around the maths
of rlver_jax.rl.losses. Each is a row of rlver_jax.rl.loss_modes.POLICY_LOSSES (with the loss
aggregations it admits); rlver_jax.rl.update calls the row of `rl.policy_loss`. Arrays as
rlver_jax.rl.losses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlver_jax.rl import advantages as adv_lib
from rlver_jax.rl import losses
from rlver_jax.rl.settings import RLSettings

Array = jax.Array


def _sequence_advantages(advantages: Array, mask: Array) -> Array:
    """[B, T] each row's mean advantage over its policy tokens, on every token: GSPO's one advantage
    per sequence (equal to the tokens' own for outcome estimators)."""
    return jnp.broadcast_to(adv_lib.masked_mean(advantages, mask, axis=-1)[:, None], advantages.shape)


def ppo(rl: RLSettings, lp: Array, old: Array, adv: Array, mask: Array) -> tuple[Array, dict]:
    """PPO's clipped surrogate (`clip_eps_low`, `clip_eps_high`: DAPO's clip-higher; `dual_clip`)."""
    return losses.ppo_policy_loss(lp, old, adv, mask, clip_eps_low=rl.clip_eps_low, clip_eps_high=rl.clip_eps_high,
                                  dual_clip=rl.dual_clip or None)


def gspo(rl: RLSettings, lp: Array, old: Array, adv: Array, mask: Array) -> tuple[Array, dict]:
    """GSPO: the row's length-normalised ratio and one advantage per row (the mean of its tokens')."""
    return losses.gspo_policy_loss(lp, old, _sequence_advantages(adv, mask), mask, clip_eps_low=rl.gspo_clip_eps_low,
                                   clip_eps_high=rl.gspo_clip_eps_high)


def gspo_token(rl: RLSettings, lp: Array, old: Array, adv: Array, mask: Array) -> tuple[Array, dict]:
    """GSPO-token: the row's ratio with each token's own advantage (turn credit, token returns)."""
    return losses.gspo_policy_loss(lp, old, adv, mask, clip_eps_low=rl.gspo_clip_eps_low,
                                   clip_eps_high=rl.gspo_clip_eps_high)


def cispo(rl: RLSettings, lp: Array, old: Array, adv: Array, mask: Array) -> tuple[Array, dict]:
    """CISPO: the importance weight truncated at 1 + `cispo_clip_eps_high`, stop-gradient."""
    return losses.cispo_policy_loss(lp, old, adv, mask, clip_eps_high=rl.cispo_clip_eps_high)

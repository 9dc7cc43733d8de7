"""Advantage estimators by name: each turns a prepared batch's token rewards (and a critic's values)
into per-token advantages (and, for a critic, returns). An algorithm's row names its estimator
(rlver_jax.rl.algorithms); the maths is in rlver_jax.rl.advantages.

Shapes: B training rows, T tokens (rlver_jax.rl.advantages' conventions).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from rlver_jax.rl import advantages as adv_lib
from rlver_jax.rl.settings import RLSettings


class EstimatorInputs(NamedTuple):
    rewards: jax.Array  # [B, T] token rewards (minus a KL penalty in "reward" mode)
    mask: jax.Array  # [B, T] 1 on policy tokens
    values: jax.Array | None  # [B, T] the critic's values; None without a critic
    group: jax.Array  # [B] group ids (padding rows have their own)
    dialogue: jax.Array  # [B] dialogue ids; a dialogue's rows are consecutive


def id_bound(rows: int) -> int:
    """An exclusive bound of the group and dialogue ids in a batch of `rows` rows (every process's):
    a dialogue's rows carry ids below the step's dialogue count (at most `rows`), a process's
    padding row b the id rows + b with b < rows (rlver_jax.rl.batch.collate's `padding_ids`)."""
    return 2 * rows


def gae(rl: RLSettings, x: EstimatorInputs) -> tuple[jax.Array, jax.Array]:
    """GAE over policy tokens (gamma, lam), whitened over the batch's policy tokens when
    `rl.whiten_advantages`; returns are the unwhitened advantages plus values."""
    advantages, returns = adv_lib.gae_advantages(x.rewards, x.values, x.mask, rl.gamma, rl.lam)
    if rl.whiten_advantages:
        advantages = adv_lib.masked_whiten(advantages, x.mask)
    return advantages, returns


def grpo(rl: RLSettings, x: EstimatorInputs) -> tuple[jax.Array, None]:
    """Each dialogue's score (its rewards summed) against its group's (`grpo_normalize_std`,
    `grpo_eps`), on every policy token of its rows."""
    scores = jnp.sum(x.rewards * x.mask, axis=-1)
    # A dialogue's rows are consecutive: its first row stands for it in its group's baseline.
    first_rows = jnp.concatenate([jnp.ones((1,), bool), x.dialogue[1:] != x.dialogue[:-1]])
    seq_adv = adv_lib.grpo_advantages(scores, x.group, id_bound(x.rewards.shape[0]),
                                      normalize_std=rl.grpo_normalize_std, eps=rl.grpo_eps, members=first_rows)
    return adv_lib.broadcast_to_tokens(seq_adv, x.mask), None


Estimator = Callable[[RLSettings, EstimatorInputs], tuple[jax.Array, jax.Array | None]]
ESTIMATORS: dict[str, Estimator] = {"gae": gae, "grpo": grpo}

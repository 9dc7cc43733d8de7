"""Advantage estimators, and the reward shaping and row selection around them.

Each estimator turns a prepared batch's token rewards (and a critic's values) into per-token
advantages (and, for a critic, returns); its row of rlver_jax.rl.algorithms.ESTIMATORS names it
and says what it needs (a critic, groups), and an algorithm's row names the estimator. The maths
is in rlver_jax.rl.advantages. Around the estimator, rlver_jax.rl.update.estimate applies:
  overlong_rewards: DAPO's soft overlong penalty of each policy turn's length (config.rl.overlong_*);
  kept_rows:        DAPO's dynamic sampling: rows of groups whose rewards are all equal are dropped
                    from the loss (config.rl.dynamic_sampling);
  turn_credit:      turn-level group advantages (turns at the same position of a group's dialogues)
                    mixed into the dialogue-level ones (config.rl.turn_credit_weight).

Shapes: B training rows, T tokens, K turns (`RLSettings.max_turns`), rlver_jax.rl.advantages'
conventions. Turn arrays come from rlver_jax.rl.batch.collate: `turn` [B, T] the dialogue's policy
turn each policy token belongs to (-1 elsewhere), `turn_rewards` [B, T] each scored turn's emotion
change / 100 on its last policy token, `turn_scored` [B, T] 1 there.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlver_jax.rl import advantages as adv_lib
from rlver_jax.rl.settings import RLSettings


class EstimatorInputs(NamedTuple):
    rewards: jax.Array  # [B, T] token rewards (shaped; minus a KL penalty in "reward" mode)
    mask: jax.Array  # [B, T] 1 on the policy tokens the loss reads (dynamic sampling may drop rows)
    values: jax.Array | None  # [B, T] the critic's values; None without a critic
    group: jax.Array  # [B] group ids (padding rows have their own)
    dialogue: jax.Array  # [B] dialogue ids; a dialogue's rows are consecutive


def id_bound(rows: int) -> int:
    """An exclusive bound of the group and dialogue ids in a batch of `rows` rows (every process's):
    a dialogue's rows carry ids below the step's dialogue count (at most `rows`), a process's
    padding row b the id rows + b with b < rows (rlver_jax.rl.batch.collate's `padding_ids`)."""
    return 2 * rows


def first_rows(dialogue: jax.Array) -> jax.Array:
    """bool [B]: each dialogue's first row (its rows are consecutive), which stands for it in group
    statistics, so they run over dialogues, not turn rows."""
    return jnp.concatenate([jnp.ones((1,), bool), dialogue[1:] != dialogue[:-1]])


def _scores(x: EstimatorInputs) -> jax.Array:
    """[B] each row's rewards summed over its policy tokens: a dialogue's score on its first row."""
    return jnp.sum(x.rewards * x.mask, axis=-1)


def gae(rl: RLSettings, x: EstimatorInputs) -> tuple[jax.Array, jax.Array]:
    """GAE over policy tokens (gamma, lam), whitened over the batch's policy tokens when
    `rl.whiten_advantages`; returns are the unwhitened advantages plus values."""
    advantages, returns = adv_lib.gae_advantages(x.rewards, x.values, x.mask, rl.gamma, rl.lam)
    if rl.whiten_advantages:
        advantages = adv_lib.masked_whiten(advantages, x.mask)
    return advantages, returns


def grpo(rl: RLSettings, x: EstimatorInputs) -> tuple[jax.Array, None]:
    """Each dialogue's score (its rewards summed) against its group's (`grpo_normalize_std`: divided
    by the group's std, Dr.GRPO not; `grpo_eps`), on every policy token of its rows."""
    seq_adv = adv_lib.grpo_advantages(_scores(x), x.group, id_bound(x.rewards.shape[0]),
                                      normalize_std=rl.grpo_normalize_std, eps=rl.grpo_eps,
                                      members=first_rows(x.dialogue))
    return adv_lib.broadcast_to_tokens(seq_adv, x.mask), None


def rloo(rl: RLSettings, x: EstimatorInputs) -> tuple[jax.Array, None]:
    """Each row's score minus the mean score of the other dialogues of its group (leave-one-out),
    on every policy token of the row; a turn row never meets its own dialogue in the baseline."""
    del rl
    seq_adv = adv_lib.rloo_advantages(_scores(x), x.group, id_bound(x.rewards.shape[0]),
                                      members=first_rows(x.dialogue), dialogue_ids=x.dialogue)
    return adv_lib.broadcast_to_tokens(seq_adv, x.mask), None


def reinforce_pp(rl: RLSettings, x: EstimatorInputs) -> tuple[jax.Array, None]:
    """REINFORCE++: each policy token's discounted return (`gamma`) over its row's policy tokens, the
    rewards carrying the KL penalty in "reward" mode, whitened over the batch's policy tokens."""
    advantages, _ = adv_lib.reinforce_pp_returns(x.rewards, x.mask, rl.gamma)
    return advantages, None


def reinforce_pp_baseline(rl: RLSettings, x: EstimatorInputs) -> tuple[jax.Array, None]:
    """REINFORCE++-baseline: each dialogue's score minus its group's mean, on its policy tokens,
    whitened over the batch's policy tokens."""
    del rl
    advantages = adv_lib.reinforce_pp_baseline_advantages(_scores(x), x.group, id_bound(x.rewards.shape[0]),
                                                          x.mask, members=first_rows(x.dialogue))
    return advantages, None


def _turn_table(values: jax.Array, turn: jax.Array, ids: jax.Array, num_ids: int, turns: int) -> jax.Array:
    """[num_ids, K]: `values` [B, T] summed by (ids[b], turn[b, t]); tokens with turn -1 (or >= K,
    which a rollout of at most K turns never makes) are left out."""
    inside = (turn >= 0) & (turn < turns)
    slot = jnp.where(inside, ids[:, None] * turns + turn, num_ids * turns)
    out = jax.ops.segment_sum(jnp.where(inside, values, 0.0).reshape(-1), slot.reshape(-1), num_ids * turns + 1)
    return out[:-1].reshape(num_ids, turns)


def _suffix_sum(x_NK: jax.Array) -> jax.Array:
    """S[n, k] = sum_{k' >= k} x[n, k']."""
    return jnp.flip(jnp.cumsum(jnp.flip(x_NK, -1), -1), -1)


def overlong_rewards(rl: RLSettings, mask: jax.Array, turn: jax.Array, dialogue: jax.Array) -> jax.Array:
    """[B, T] DAPO's soft overlong penalty (advantages.overlong_penalty) of each policy turn's length
    (its generated tokens) against the turn budget `rl.max_new_tokens`, ramping over the last
    `rl.overlong_buffer` tokens up to `rl.overlong_penalty`, on the turn's last policy token.

    Each turn is one response of the policy, so each is judged on its own length, and the
    dialogue's score is its reward plus its turns' penalties. Placed as the rewards of
    rlver_jax.rl.batch.token_rewards: a row holding all of a dialogue's turns gets each turn's
    penalty at that turn; a row holding one turn (think_history "drop") is its own episode and gets
    the penalties of its turn and of the dialogue's later turns (held by other rows)."""
    turns, rows = rl.max_turns, mask.shape[0]
    m = (mask > 0).astype(jnp.float32)
    length_BK = _turn_table(m, turn, jnp.arange(rows), rows, turns)
    penalty_BK = jnp.where(length_BK > 0, adv_lib.overlong_penalty(length_BK, rl.max_new_tokens, rl.overlong_buffer,
                                                                  rl.overlong_penalty), 0.0)
    by_dialogue = jax.ops.segment_sum(penalty_BK, dialogue, id_bound(rows))  # [2B, K]
    # The row's turn k: this turn's penalty and those of later turns that other rows hold.
    placed_BK = _suffix_sum(by_dialogue)[dialogue] - _suffix_sum(penalty_BK) + penalty_BK
    next_turn = jnp.concatenate([turn[:, 1:], jnp.full((rows, 1), -1, turn.dtype)], axis=1)
    last = (turn >= 0) & (turn < turns) & (next_turn != turn) & (m > 0)
    placed = jnp.take_along_axis(placed_BK, jnp.clip(turn, 0, turns - 1), axis=1)
    return jnp.where(last, placed, 0.0)


def kept_rows(rewards: jax.Array, mask: jax.Array, group: jax.Array, dialogue: jax.Array
              ) -> tuple[jax.Array, jax.Array]:
    """DAPO's dynamic sampling as a row selection: (bool [B] the rows to train on, the number of
    filtered groups). A group whose dialogues' rewards (each dialogue's first row's `rewards`
    summed, before any shaping) are all equal, or that has one dialogue, carries no signal for a
    group baseline; its rows are dropped from the loss (advantages.degenerate_groups). Padding rows
    (no policy tokens) belong to no group that counts."""
    n = id_bound(mask.shape[0])
    members = first_rows(dialogue) & jnp.any(mask > 0, axis=-1)
    scores = jnp.sum(rewards * mask, axis=-1)
    filtered = adv_lib.degenerate_groups(scores, group, n, members=members)
    filtered &= jax.ops.segment_sum(members.astype(jnp.int32), group, n) > 0
    return ~filtered[group], jnp.sum(filtered).astype(jnp.float32)


def turn_credit(rl: RLSettings, advantages: jax.Array, mask: jax.Array, group: jax.Array, turn: jax.Array,
                turn_rewards: jax.Array, turn_scored: jax.Array) -> jax.Array:
    """[B, T] the dialogue-level `advantages` plus `rl.turn_credit_weight` x the turn-level group
    advantage of each policy token's turn (advantages.turn_group_advantages, normalised as GRPO by
    `grpo_normalize_std`, `grpo_eps`): turn k of a dialogue against turn k of the other dialogues of
    its group, which share their opening (MT-GRPO / GiGPO's step groups by turn position); a turn
    the simulator did not score, or that only one dialogue of its group reached, adds nothing. With
    one row per turn (think_history "drop") a turn's advantage lands on its own row."""
    turns, rows = rl.max_turns, mask.shape[0]
    own = jnp.arange(rows)
    rewards_BK = _turn_table(turn_rewards * turn_scored, turn, own, rows, turns)
    valid_BK = _turn_table(turn_scored, turn, own, rows, turns) > 0
    turn_adv = adv_lib.turn_group_advantages(rewards_BK, valid_BK, group, id_bound(rows),
                                             normalize_std=rl.grpo_normalize_std, eps=rl.grpo_eps)
    index = jnp.where(turn < turns, turn, -1)
    mixed = adv_lib.mix_turn_advantages(advantages, turn_adv, index, rl.turn_credit_weight)
    return mixed * (mask > 0)

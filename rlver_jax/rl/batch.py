"""Collate finished dialogues into the fixed-shape arrays the jitted update consumes."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rlver_jax.buckets import bucket
from rlver_jax.rollout.sequence import DialogueSequence

REWARD_MODES = ("final", "per_turn")


@dataclasses.dataclass
class TrainBatch:
    """Host arrays, rows right-padded to a bucketed length; padding rows have all-zero masks."""

    tokens: np.ndarray  # int32 [B, T]
    attention_mask: np.ndarray  # int32 [B, T]
    policy_mask: np.ndarray  # float32 [B, T]
    rewards: np.ndarray  # float32 [B, T], on policy tokens only
    sample_logprobs: np.ndarray  # float32 [B, T], recorded by the sampler
    group: np.ndarray  # int32 [B], GRPO group id; padding rows get their own ids

    def arrays(self) -> dict[str, np.ndarray]:
        """The fields, plus `policy_positions` derived from the policy mask."""
        return {**dataclasses.asdict(self), "policy_positions": policy_positions(self.policy_mask)}


def token_rewards(seq: DialogueSequence, mode: str) -> dict[int, float]:
    """Reward per token index.

    final: the paper's reward (final emotion / 100, clipped at 0) on the last policy token.
    per_turn: each scored turn's emotion change / 100 on that turn's last policy token, so GAE
      credits the turn that moved the user. A format failure puts -(emotion before it) / 100 on
      the failed turn, so the dialogue's return is (0 - initial emotion) / 100: the final mode's
      reward of 0 minus the same constant as every other dialogue.
    """
    if mode == "final":
        return {seq.turn_ends[-1]: seq.reward}
    if mode != "per_turn":
        raise ValueError(f"config.rl.reward_mode={mode!r}; use one of {REWARD_MODES}")
    out = {}
    for i, end in enumerate(seq.turn_ends):
        if i + 1 < len(seq.emotions):
            out[end] = (seq.emotions[i + 1] - seq.emotions[i]) / 100.0
    if seq.format_failure:
        out[seq.turn_ends[-1]] = out.get(seq.turn_ends[-1], 0.0) - seq.emotions[-1] / 100.0
    return out


def policy_positions(policy_mask: np.ndarray) -> np.ndarray:
    """int32 [B, C]: each row's policy-token indices, ascending, right-padded with 0.

    The update scores only these tokens. C is the longest row's count rounded up to a quarter of
    T, so a run compiles at most four widths per sequence-length bucket.
    """
    b, t = policy_mask.shape
    count = int((policy_mask > 0).sum(-1).max(initial=0))
    width = bucket(count, [t // 4 * k for k in (1, 2, 3, 4)]) if t % 4 == 0 else t
    out = np.zeros((b, width), np.int32)
    for row in range(b):
        idx = np.flatnonzero(policy_mask[row] > 0)
        out[row, :len(idx)] = idx
    return out


def collate(
    sequences: Sequence[DialogueSequence],
    *,
    batch_size: int,
    reward_mode: str,
    length_multiple: int = 128,
    pad_id: int = 0,
) -> TrainBatch:
    """Stack `sequences` (at most batch_size, trainable ones) into a TrainBatch of batch_size rows.

    The length is bucketed to a multiple of `length_multiple` so the update compiles once per
    bucket; missing rows are padding with zero masks, which every loss ignores.
    """
    if len(sequences) > batch_size:
        raise ValueError(f"{len(sequences)} dialogues do not fit a batch of {batch_size}")
    for seq in sequences:
        seq.check()
        if not seq.trainable:
            raise ValueError(f"dialogue {seq.profile_id} is not trainable ({seq.end_reason}); filter it out first")
    t = bucket(max((len(s.tokens) for s in sequences), default=1), multiple=length_multiple)
    shape = (batch_size, t)
    batch = TrainBatch(
        tokens=np.full(shape, pad_id, np.int32), attention_mask=np.zeros(shape, np.int32),
        policy_mask=np.zeros(shape, np.float32), rewards=np.zeros(shape, np.float32),
        sample_logprobs=np.zeros(shape, np.float32),
        # Padding rows get fresh group ids so they never join a real group's baseline.
        group=np.arange(batch_size, dtype=np.int32) + batch_size)
    for b, seq in enumerate(sequences):
        n = len(seq.tokens)
        batch.tokens[b, :n] = seq.tokens
        batch.attention_mask[b, :n] = 1
        batch.policy_mask[b, :n] = seq.policy_mask
        batch.sample_logprobs[b, :n] = seq.logprobs
        batch.group[b] = seq.group
        for idx, r in token_rewards(seq, reward_mode).items():
            batch.rewards[b, idx] = r
    return batch

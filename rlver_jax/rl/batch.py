"""Collate finished dialogues into the fixed-shape arrays the jitted update consumes.

A dialogue contributes its training rows (rollout.sequence.DialogueSequence.rows): one row with
think_history "keep", one per policy turn with "drop". The batch's row count is a multiple of
the number of dialogue slots (`batch_size`), so it splits into the configured mini-batches,
micro-batches and batch shards exactly as a batch of one row per dialogue does; rows beyond
the dialogues' are padding with zero masks.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np

from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.sampling.buckets import bucket

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RowTable:
    """Every process's rows as packing reads them (rlver_jax.rl.packing): their lengths [Q, R] and
    policy masks [Q, R, T] (bool), the R rows of each of Q processes in its batch's order."""

    lengths: np.ndarray
    policy: np.ndarray

    @classmethod
    def of(cls, batch: TrainBatch) -> RowTable:
        """The table of one process's batch."""
        return cls(batch.attention_mask.sum(-1)[None].astype(np.int32), (batch.policy_mask > 0)[None])


@dataclasses.dataclass
class TrainBatch:
    """Host arrays, rows right-padded to a bucketed length; padding rows have all-zero masks."""

    tokens: np.ndarray  # int32 [B, T]
    attention_mask: np.ndarray  # int32 [B, T]
    policy_mask: np.ndarray  # float32 [B, T]
    rewards: np.ndarray  # float32 [B, T], on policy tokens only
    sample_logprobs: np.ndarray  # float32 [B, T], recorded by the sampler
    group: np.ndarray  # int32 [B], GRPO group id; padding rows get their own ids
    # int32 [B], the row's dialogue (its index in the collated list); a dialogue's rows are
    # consecutive; padding rows get their own ids.
    dialogue: np.ndarray
    # The turns, for overlong shaping and turn-level credit (rlver_jax.rl.estimators); a batch built
    # without them (a planner's, a benchmark's) has no turns: -1 and zeros.
    turn: np.ndarray | None = None  # int32 [B, T], the dialogue's policy turn of each policy token; -1 elsewhere
    turn_rewards: np.ndarray | None = None  # float32 [B, T], a scored turn's reward (`turn_rewards`) on its last token
    turn_scored: np.ndarray | None = None  # float32 [B, T], 1 on the last policy token of each scored turn
    # Every process's rows for packing (StepCollation, several processes); None: this batch's own.
    table: RowTable | None = None

    def __post_init__(self):
        shape = self.policy_mask.shape
        if self.turn is None:
            self.turn = np.full(shape, -1, np.int32)
        for name in ("turn_rewards", "turn_scored"):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(shape, np.float32))

    def arrays(self, policy_tokens: int | None = None) -> dict[str, np.ndarray]:
        """The array fields, plus `policy_positions` derived from the policy mask (`policy_tokens`: see there)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "table"}
        return {**fields, "policy_positions": policy_positions(self.policy_mask, policy_tokens)}

    def rows(self) -> RowTable:
        """Every process's rows (`table`), or this batch's."""
        return self.table or RowTable.of(self)


def _by_token(seq: DialogueSequence, rewards: list[float | None] | None) -> dict[int, float]:
    """Per-turn rewards stored on `seq` (rollout.sequence: `episode_rewards` or `turn_rewards`) by
    the index in `seq.tokens` of each turn's last policy token; turns without one left out."""
    if rewards is None:
        raise ValueError(f"dialogue {seq.profile_id} carries no reward: rollouts score each dialogue as it ends "
                         "(rlver_jax.rollout.rewards.score)")
    if len(rewards) != len(seq.turn_ends):
        raise ValueError(f"dialogue {seq.profile_id}: {len(rewards)} turn rewards for {len(seq.turn_ends)} turn ends")
    return {end: r for end, r in zip(seq.turn_ends, rewards) if r is not None}


def token_rewards(seq: DialogueSequence) -> dict[int, float]:
    """Reward per token index (of `seq.tokens`): the dialogue's stored `episode_rewards`, each on
    its turn's last policy token (its reward source's, rlver_jax.rollout.rewards: the final
    emotion's on the last turn, or each turn's emotion change).
    With one row per turn (think_history "drop") each row is its own episode, so its last
    policy token gets the dialogue's return from that turn on (the sum of the rewards above at
    this and later turns): with "final" every turn row carries the dialogue's final reward, as
    in the reference.
    """
    dialogue = _by_token(seq, seq.episode_rewards)
    if len(seq.rows) <= 1:
        return dialogue
    return {end: sum(r for idx, r in dialogue.items() if idx >= end) for end in seq.turn_ends}


def dialogue_return(seq: DialogueSequence) -> float:
    """The dialogue's episode rewards summed (its first row's, whatever its rows): the score an
    outcome estimator compares, before any shaping."""
    return float(sum(_by_token(seq, seq.episode_rewards).values()))


def turn_rewards(seq: DialogueSequence) -> dict[int, float]:
    """Each scored turn's own reward (the stored `turn_rewards`), on its last policy token (by index
    of `seq.tokens`), never summed over later turns, whatever the rows: the turn-level credit
    compares each turn with the turns at its position."""
    return _by_token(seq, seq.turn_rewards)


def turn_index(seq: DialogueSequence) -> np.ndarray:
    """int32 [len(seq.tokens)]: the policy turn (0, 1, ...) each policy token belongs to, -1 on
    other tokens: turn k's policy tokens lie after turn_ends[k - 1] and up to turn_ends[k]."""
    idx = np.arange(len(seq.tokens))
    turn = np.searchsorted(np.asarray(seq.turn_ends), idx, side="left").astype(np.int32)
    return np.where(np.asarray(seq.policy_mask) > 0, turn, -1).astype(np.int32)


def policy_positions(policy_mask: np.ndarray, policy_tokens: int | None = None) -> np.ndarray:
    """int32 [B, C]: each row's policy-token indices, ascending, right-padded with 0.

    The update scores only these tokens. C is the longest row's count (or `policy_tokens`, at
    least that: the processes of a multi-host run pass the longest over all of them, so they
    agree on C) rounded up to a quarter of T, so a run compiles at most four widths per
    sequence-length bucket.
    """
    b, t = policy_mask.shape
    count = int((policy_mask > 0).sum(-1).max(initial=0))
    if policy_tokens is not None:
        if policy_tokens < count:
            raise ValueError(f"policy_tokens={policy_tokens} is below the longest row's {count} policy tokens")
        count = policy_tokens
    width = bucket(count, [t // 4 * k for k in (1, 2, 3, 4)]) if t % 4 == 0 else t
    out = np.zeros((b, width), np.int32)
    for row in range(b):
        idx = np.flatnonzero(policy_mask[row] > 0)
        out[row, :len(idx)] = idx
    return out


def minibatch_unit(mini_batch_size: int, micro_batch_size: int, dialogues: int) -> tuple[int, int, int]:
    """How a step's batch of `dialogues` dialogues is cut: (mini_batch_size, micro_batch_size,
    batch_size) for rlver_jax.rl.settings.RLSettings. A configured mini_batch_size of 0 means the
    whole batch, one optimizer step per epoch, cut in dialogues whatever their rows (batch_size =
    dialogues); otherwise mini-batches of mini_batch_size train-batch rows (the reference's
    ppo_mini_batch_size; batch_size 0). A micro-batch never exceeds its mini-batch."""
    whole = not mini_batch_size
    mini = mini_batch_size or dialogues
    return mini, min(micro_batch_size, mini), dialogues if whole else 0


def row_multiple(batch_size: int, mini_batch_size: int, share: int, processes: int) -> int:
    """The multiple of a process's rows in a step's batch (`share`: its dialogue slots): its
    dialogue slots when mini-batches are cut in dialogues (batch_size > 0), else its share of a
    mini-batch, so that the global batch is whole mini-batches."""
    return share if batch_size else mini_batch_size // processes


def row_extent(sequences: Sequence[DialogueSequence]) -> tuple[int, int]:
    """(tokens, policy tokens) of the longest row of `sequences`, for T and C (0 for none)."""
    longest = most = 0
    for seq in sequences:
        for start, end in seq.rows:
            longest = max(longest, end - start)
            most = max(most, int(sum(1 for m in seq.policy_mask[start:end] if m > 0)))
    return longest, most


def batch_rows(sequences: Sequence[DialogueSequence], batch_size: int) -> int:
    """The rows of the batch of `sequences`: the smallest multiple of batch_size (or of the
    per-process mini-batch share, rows mode) that holds all their rows."""
    return bucket(sum(len(s.rows) for s in sequences), multiple=batch_size)


def collate(
    sequences: Sequence[DialogueSequence],
    *,
    batch_size: int,
    length_multiple: int = 128,
    pad_id: int = 0,
    rows: int | None = None,
    length: int | None = None,
    dialogue_ids: Sequence[int] | None = None,
    padding_ids: int | None = None,
    row_multiple: int | None = None,
) -> TrainBatch:
    """Stack the rows of `sequences` (at most batch_size trainable dialogues) into a TrainBatch,
    with the rewards stored on each (`token_rewards`, `turn_rewards`).

    batch_size counts dialogue slots; the batch has `rows` rows (default `batch_rows`; a
    multiple of `row_multiple`, default batch_size: several hosts pass the largest of theirs, so
    their shapes agree).
    The length is bucketed to a multiple of `length_multiple` so the update compiles once per
    bucket, or is `length`; missing rows are padding with zero masks, which every loss ignores.
    A dialogue's rows carry its id, `dialogue_ids[d]` (default d), and its group; padding row b
    gets group and dialogue id padding_ids + b (default rows + b), which no dialogue uses. The
    processes of a multi-host run agree on rows and length, pass their dialogues' global indices
    and the global row count, so that ids are unique over the whole batch.
    """
    if len(sequences) > batch_size:
        raise ValueError(f"{len(sequences)} dialogues do not fit a batch of {batch_size}")
    for seq in sequences:
        seq.check()
        if not seq.trainable:
            raise ValueError(f"dialogue {seq.profile_id} is not trainable ({seq.end_reason}); filter it out first")
    multiple = row_multiple or batch_size
    needed = batch_rows(sequences, multiple)
    rows = needed if rows is None else rows
    if rows < needed or rows % multiple:
        unit = f"row_multiple={row_multiple}" if row_multiple else f"batch_size={batch_size}"
        raise ValueError(f"rows={rows}: need a multiple of {unit} of at least {needed}")
    longest, _ = row_extent(sequences)
    t = bucket(longest, multiple=length_multiple) if length is None else length
    if t < longest:
        raise ValueError(f"length={t} is shorter than the longest row ({longest} tokens)")
    shape = (rows, t)
    # Padding rows get fresh group and dialogue ids so they never join a real group's baseline.
    pad_ids = np.arange(rows, dtype=np.int32) + (rows if padding_ids is None else padding_ids)
    batch = TrainBatch(
        tokens=np.full(shape, pad_id, np.int32), attention_mask=np.zeros(shape, np.int32),
        policy_mask=np.zeros(shape, np.float32), rewards=np.zeros(shape, np.float32),
        sample_logprobs=np.zeros(shape, np.float32), group=pad_ids.copy(), dialogue=pad_ids.copy())
    b = 0
    ids = range(len(sequences)) if dialogue_ids is None else dialogue_ids
    for d, seq in zip(ids, sequences):
        rewards, credit, turns = token_rewards(seq), turn_rewards(seq), turn_index(seq)
        for start, end in seq.rows:
            n = end - start
            batch.tokens[b, :n] = seq.tokens[start:end]
            batch.attention_mask[b, :n] = 1
            batch.policy_mask[b, :n] = seq.policy_mask[start:end]
            batch.sample_logprobs[b, :n] = seq.logprobs[start:end]
            batch.turn[b, :n] = turns[start:end]
            batch.group[b], batch.dialogue[b] = seq.group, d
            for idx, r in rewards.items():
                if start <= idx < end:
                    batch.rewards[b, idx - start] = r
            for idx, r in credit.items():
                if start <= idx < end:
                    batch.turn_rewards[b, idx - start], batch.turn_scored[b, idx - start] = r, 1.0
            b += 1
    return batch


def row_table(per_process: Sequence[Sequence[DialogueSequence]], rows: int, length: int) -> RowTable:
    """The RowTable of each process's dialogues (`per_process`, each process's as `collate` takes
    them), `rows` rows of `length` slots each."""
    lengths = np.zeros((len(per_process), rows), np.int32)
    policy = np.zeros((len(per_process), rows, length), bool)
    for q, sequences in enumerate(per_process):
        for b, (seq, (start, end)) in enumerate((s, r) for s in sequences for r in s.rows):
            lengths[q, b] = end - start
            policy[q, b, :end - start] = np.asarray(seq.policy_mask[start:end]) > 0
    return RowTable(lengths, policy)


@dataclasses.dataclass(frozen=True)
class StepCollation:
    """How a step's dialogues become this process's rows of the one global train batch: the
    mini-batch unit (rlver_jax.rl.settings.RLSettings' batch_size and mini_batch_size), the length
    bucket and which process holds each dialogue's rows."""

    batch_size: int  # dialogues per step when mini-batches are cut in dialogues; 0: in rows
    mini_batch_size: int
    length_multiple: int  # the rows' length bucket
    pad_id: int
    dialogue_process: np.ndarray  # [dialogues of a step] the process holding each one's rows
    process: int = 0  # this process
    processes: int = 1
    pack_rows: bool = False  # config.rl.pack_rows: the batch carries every process's rows (RowTable)

    def collate(self, dialogues: Sequence[DialogueSequence], share: int, step: int = 0) -> tuple[TrainBatch, int]:
        """This process's rows of the batch of `dialogues` (every process's, in step order, at least
        one trainable; `share`: dialogue slots per process): its trainable dialogues' rows, then
        padding, and the policy-token count that sizes C.

        The shapes come from every process's dialogues, so every process agrees on the rows per
        process (the most any process needs), T (the longest row, bucketed) and C without another
        exchange; row and group ids are global. With `pack_rows` on several processes the batch
        carries every process's rows (`row_table`), for the packed layouts (rlver_jax.rl.packing)."""
        # Rows mode (batch_size 0): rows a multiple of each process's share of a mini-batch, so the
        # global batch is whole mini-batches; one program per multiple, at most max_turns x dialogues / mini.
        multiple = row_multiple(self.batch_size, self.mini_batch_size, share, self.processes)
        owner = self.dialogue_process
        held = [[dialogues[d] for d in np.flatnonzero(owner == p) if dialogues[d].trainable]
                for p in range(self.processes)]
        rows = max(batch_rows(h, multiple) for h in held)
        longest, policy_tokens = row_extent([s for s in dialogues if s.trainable])
        length = bucket(longest, multiple=self.length_multiple)
        mine = [(int(d), dialogues[d]) for d in np.flatnonzero(owner == self.process) if dialogues[d].trainable]
        if self.processes > 1:
            alone = row_extent([s for _, s in mine])
            log.info("step %d: batch length T=%d, policy tokens %d, rows %d per process (this process's dialogues "
                     "alone: T=%d, %d)", step, length, policy_tokens, rows,
                     bucket(alone[0], multiple=self.length_multiple), alone[1])
        batch = collate([s for _, s in mine], batch_size=share, rows=rows, length=length,
                        dialogue_ids=[d for d, _ in mine], padding_ids=rows * self.processes, pad_id=self.pad_id,
                        row_multiple=multiple)
        if self.pack_rows and self.processes > 1:
            batch.table = row_table(held, rows, length)
        return batch, policy_tokens

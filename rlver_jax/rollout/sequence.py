"""One finished dialogue: the record rollouts hand to the trainer, the logs and the benchmark."""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

# The keys of a dialogue's record (its transcript line), in the order they are written.
RECORD_KEYS = ("profile_id", "group", "language", "end_reason", "final_emotion", "emotions", "turns", "messages",
               "format_failure", "truncated", "simulator_error", "simulator_state", "policy_version")
# Then its reward (rlver_jax.rollout.rewards); a record written before rewards were stored has none
# ("reward" alone in a training transcript of then).
REWARD_KEYS = ("reward", "episode_rewards", "turn_rewards")


@dataclasses.dataclass
class DialogueSequence:
    """A whole multi-turn dialogue: its token sequence for training, its transcript for the logs.

    The token view (token policies only; empty for a text policy and after `from_record`): the
    dialogue's training rows, one after another. With think_history "keep" (and in no-think
    mode) one row: the whole conversation (system prompt, every user and policy turn). With
    "drop" one row per policy turn: that turn's prompt (the history with earlier thoughts
    dropped, rlver_jax.rollout.history) followed by the turn's whole output. Either way exactly
    the ids the sampler produced plus the chat-template ids around them.
    tokens: the rows' token ids, concatenated.
    row_starts: index in `tokens` where each row begins ([0] for one row).
    policy_mask: 1 on tokens the policy generated (every assistant turn, its `<|im_end|>` too)
      and trains on: with "drop", only each row's own turn.
    logprobs: the sampling-time log-probability of each policy token under the unmodified model
      (temperature 1); 0 elsewhere.
    turn_ends: index in `tokens` of the last policy token of each policy turn.

    The transcript (`to_record`, one JSON line per dialogue):
    emotions: the user's emotion before the first policy turn, then after each scored turn.
    turns: one dict per policy turn (aligned with turn_ends): turn, raw (the whole sampled text),
      thinking, reply, stopped, format_ok, policy_version (the parameter version that wrote it;
      transcripts written before turns recorded it: the dialogue's) and, once the user answered,
      change, emotion, band, simulator_thoughts, user.
    messages: the conversation with the replies as the user read them (system, user, assistant
      replies as sent, a final goodbye); the policy's context with think_history "drop".
    simulator_state: the simulator's DialogueState.to_dict().

    Its reward, as its source scored it where rollouts finished it (rlver_jax.rollout.rewards.score;
    all None before, or in a transcript written before rewards were stored):
    reward: the dialogue's reward (summaries, transcripts).
    episode_rewards: per policy turn, the update's reward on its last policy token with the
      dialogue as one episode (rlver_jax.rl.batch.token_rewards); None on a turn without one.
    turn_rewards: per policy turn, its own reward for turn-level credit; None on an unscored turn.
    """

    profile_id: str
    group: int  # GRPO group: the dialogues sampled for the same profile share it
    tokens: list[int]
    policy_mask: list[int]
    logprobs: list[float]
    turn_ends: list[int]
    emotions: list[float]
    end_reason: str  # goodbye | success | failure | turn_limit | truncated | format_failure | simulator_error
    truncated: bool = False
    format_failure: bool = False
    simulator_error: bool = False
    policy_version: int = 0  # the parameter version of its first (oldest) policy turn
    language: str = ""  # "zh" or "en"
    turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    messages: list[dict[str, str]] = dataclasses.field(default_factory=list)
    simulator_state: dict[str, Any] = dataclasses.field(default_factory=dict)
    row_starts: list[int] = dataclasses.field(default_factory=lambda: [0])
    # A turn beyond the staleness bound of its update: left out of training (rlver_jax.train.loop).
    stale: bool = False
    reward: float | None = None
    episode_rewards: list[float | None] | None = None
    turn_rewards: list[float | None] | None = None

    @property
    def rows(self) -> list[tuple[int, int]]:
        """(start, end) in `tokens` of each training row; none without a token view."""
        if not self.tokens:
            return []
        return list(zip(self.row_starts, self.row_starts[1:] + [len(self.tokens)]))

    def turn_versions(self) -> list[int]:
        """The parameter version that wrote each policy turn: from `turns`; a transcript written
        before turns recorded it, all `policy_version` (one per turn end where `turns` is empty)."""
        if not self.turns:
            return [self.policy_version] * len(self.turn_ends)
        return [t.get("policy_version", self.policy_version) for t in self.turns]

    def policy_token_versions(self) -> list[int]:
        """The parameter version of each policy token (policy_mask 1), in order: its turn's, the
        first turn whose turn end is at or after it (the last turn past every turn end)."""
        versions = self.turn_versions() or [self.policy_version]
        last = len(versions) - 1
        return [versions[min(bisect.bisect_left(self.turn_ends, i), last)]
                for i, m in enumerate(self.policy_mask) if m]

    @property
    def policy_turns(self) -> int:
        """Its policy turns: one per turn record (per turn end in a dialogue built without them)."""
        return len(self.turns) or len(self.turn_ends)

    @property
    def final_emotion(self) -> float:
        return self.emotions[-1] if self.emotions else 0.0

    @property
    def ended_by_format_failure(self) -> bool:
        return self.end_reason == "format_failure"

    @property
    def trainable(self) -> bool:
        """Dialogues the simulator failed on carry no reward signal and are left out, as are those
        sampled beyond the staleness bound (`stale`)."""
        return not self.simulator_error and not self.stale and bool(self.turn_ends)

    def to_record(self) -> dict[str, Any]:
        """The transcript (JSON-serialisable; it shares this dialogue's lists): RECORD_KEYS and
        REWARD_KEYS, i.e. every field but the token view, plus final_emotion."""
        return {k: getattr(self, k) for k in RECORD_KEYS + REWARD_KEYS}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> DialogueSequence:
        """The dialogue of a transcript written by `to_record` (REWARD_KEYS may be missing: None;
        other keys, such as the training logs' step, are ignored); its token view is empty."""
        if missing := [k for k in RECORD_KEYS if k not in record]:
            raise ValueError(f"not a dialogue record: keys {missing} missing")
        seq = cls(profile_id=record["profile_id"], group=record["group"], tokens=[], policy_mask=[], logprobs=[],
                  turn_ends=[], emotions=list(record["emotions"]), end_reason=record["end_reason"] or "unknown",
                  truncated=record["truncated"], format_failure=record["format_failure"],
                  simulator_error=record["simulator_error"], policy_version=record["policy_version"],
                  language=record["language"], turns=list(record["turns"]), messages=list(record["messages"]),
                  simulator_state=record["simulator_state"], **{k: record.get(k) for k in REWARD_KEYS})
        if seq.final_emotion != record["final_emotion"]:
            raise ValueError(f"dialogue {seq.profile_id}: final_emotion {record['final_emotion']} is not the last "
                             f"of its emotions {seq.emotions}")
        return seq

    def check(self) -> None:
        """Raise if the parallel lists disagree (a bug in the rollout, not bad user input)."""
        n = len(self.tokens)
        if len(self.policy_mask) != n or len(self.logprobs) != n:
            raise ValueError(f"dialogue {self.profile_id}: tokens/policy_mask/logprobs lengths differ")
        if any(not 0 <= t < n or not self.policy_mask[t] for t in self.turn_ends):
            raise ValueError(f"dialogue {self.profile_id}: a turn end is not a policy token")
        starts = self.row_starts
        if n and (starts[:1] != [0] or any(b <= a for a, b in zip(starts, starts[1:])) or starts[-1] >= n):
            raise ValueError(f"dialogue {self.profile_id}: row_starts {starts} do not split {n} tokens into rows")

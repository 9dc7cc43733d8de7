"""One finished dialogue as a training sequence: the contract between rollouts and the trainer."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class DialogueSequence:
    """A whole multi-turn dialogue as one token sequence, plus what the trainer and logs need.

    tokens: the conversation's token ids (system prompt, every user and policy turn), exactly
      the ids the sampler produced plus the chat-template ids around them.
    policy_mask: 1 on tokens the policy generated (every assistant turn, its `<|im_end|>` too).
    logprobs: the sampling-time log-probability of each policy token under the unmodified model
      (temperature 1); 0 elsewhere.
    turn_ends: index in `tokens` of the last policy token of each policy turn.
    emotions: the user's emotion before the first policy turn, then after each scored turn.
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
    policy_version: int = 0  # trainer step whose parameters wrote this dialogue
    transcript: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def final_emotion(self) -> float:
        return self.emotions[-1] if self.emotions else 0.0

    @property
    def reward(self) -> float:
        """The paper's reward: final emotion / 100, clipped at 0; 0 after a format failure."""
        if self.format_failure:
            return 0.0
        return max(self.final_emotion, 0.0) / 100.0

    @property
    def trainable(self) -> bool:
        """Dialogues the simulator failed on carry no reward signal and are left out."""
        return not self.simulator_error and bool(self.turn_ends)

    def check(self) -> None:
        """Raise if the parallel lists disagree (a bug in the rollout, not bad user input)."""
        n = len(self.tokens)
        if len(self.policy_mask) != n or len(self.logprobs) != n:
            raise ValueError(f"dialogue {self.profile_id}: tokens/policy_mask/logprobs lengths differ")
        if any(not 0 <= t < n or not self.policy_mask[t] for t in self.turn_ends):
            raise ValueError(f"dialogue {self.profile_id}: a turn end is not a policy token")

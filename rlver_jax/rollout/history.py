"""What the policy sees of one running dialogue, and the turn request it builds from it.

EpisodeRunner keeps each dialogue's messages and turn records; a history keeps the rest, in the
policy's own form. `TokenHistory` (token policies, e.g. JaxPolicy) holds the dialogue as one token
sequence, assembled from the exact sampled ids plus the chat template's ids (rlver_jax.chat), never
by re-tokenising decoded text, with its policy mask, log-probs, turn ends and token budget.
`TextHistory` (text policies behind a chat API) needs nothing but the messages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rlver_jax import chat
from rlver_jax.rollout.policy import PolicyTurn, TurnRequest


@dataclasses.dataclass
class TokenHistory:
    """One dialogue as the token sequence a token policy continues (DialogueSequence's token view)."""

    chat: chat.ChatTokens
    max_new_tokens: int  # per policy turn
    max_total_tokens: int  # per dialogue
    tokens: list[int] = dataclasses.field(default_factory=list)
    policy_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    turn_ends: list[int] = dataclasses.field(default_factory=list)

    @property
    def _closing(self) -> int:
        """Template tokens after a turn's sampled ids: <|im_end|> (when cut) and "\n"."""
        return 1 + len(self.chat.newline)

    def _extend(self, ids: Sequence[int], mask: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        self.tokens.extend(ids)
        self.policy_mask.extend(mask)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def add_system(self, text: str) -> None:
        self._extend(*chat.encode_message(self.chat, "system", text))

    def add_user(self, text: str) -> bool:
        """Append a user message; False (and nothing appended) when no policy turn would fit after it."""
        ids, mask = chat.encode_message(self.chat, "user", text)
        # Room for the generation prompt and at least one sampled token.
        if len(self.tokens) + len(ids) + len(self.chat.assistant_header) + 1 + self._closing > self.max_total_tokens:
            return False
        self._extend(ids, mask)
        return True

    def request(self, messages: Sequence[dict[str, str]], **ident: int) -> TurnRequest:
        """The next turn's request: the history plus the generation prompt, within the token budget."""
        prompt = self.tokens + list(self.chat.assistant_header)
        budget = min(self.max_new_tokens, self.max_total_tokens - len(prompt) - self._closing)
        return TurnRequest(prompt_ids=prompt, messages=list(messages), max_new_tokens=budget, **ident)

    def add_turn(self, turn: PolicyTurn) -> bool:
        """Append a sampled turn (generation prompt, sampled ids, closing template tokens); False
        when it was cut and the dialogue's token budget is spent."""
        header = list(self.chat.assistant_header)
        self._extend(header, [0] * len(header))
        ids, mask = chat.assistant_turn_ids(self.chat, turn.token_ids)
        lps = list(turn.logprobs) + [0.0] * (len(ids) - len(turn.logprobs))
        start = len(self.tokens)
        self._extend(ids, mask, lps)
        self.turn_ends.append(start + len(turn.token_ids) - 1)
        return turn.stopped or len(self.tokens) < self.max_total_tokens


@dataclasses.dataclass
class TextHistory:
    """A dialogue with a text policy: the messages are the whole request; no token view."""

    max_new_tokens: int  # per policy turn
    tokens: list[int] = dataclasses.field(default_factory=list, init=False)  # always empty
    policy_mask: list[int] = dataclasses.field(default_factory=list, init=False)
    logprobs: list[float] = dataclasses.field(default_factory=list, init=False)
    turn_ends: list[int] = dataclasses.field(default_factory=list, init=False)

    def add_system(self, text: str) -> None:
        """The system message is in the messages already."""

    def add_user(self, text: str) -> bool:
        return True

    def request(self, messages: Sequence[dict[str, str]], **ident: int) -> TurnRequest:
        return TurnRequest(prompt_ids=None, messages=list(messages), max_new_tokens=self.max_new_tokens, **ident)

    def add_turn(self, turn: PolicyTurn) -> bool:
        return True

"""What the policy sees of one running dialogue, and the turn request it builds from it.

EpisodeRunner keeps each dialogue's transcript; a history keeps the policy's context, in the
policy's own form. `TokenHistory` (token policies, e.g. StaticEngine) assembles the context and the
training rows from the exact sampled ids plus the chat template's ids (rlver_jax.text.chat), never by
decoding a sequence and re-encoding it, with the rows' policy mask, log-probs, turn ends and the
token budget. `TextHistory` (text policies behind a chat API) needs only the messages.

Earlier thoughts (`config.rollout.think_history`, think mode only):
  keep: the context holds every earlier turn as sampled, thinking included; the dialogue is one
        training row (each later turn continues it).
  drop: as the reference rollout, the context holds each earlier turn as the reply the user
        read (the text after the last "</think>", encoded as the chat template encodes that
        message); each turn is its own training row: its prompt (that context plus the
        generation prompt) followed by the turn's whole sampled output.
Both histories build the same context, so a JAX policy and an endpoint policy see the same
conversation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rlver_jax.engines.seam import PolicyTurn, TurnRequest
from rlver_jax.text import chat

THINK_HISTORIES = ("drop", "keep")


def _context_message(turn: PolicyTurn, shown: str, drop_thoughts: bool) -> dict[str, str]:
    """The assistant message a later turn's context holds for `turn`."""
    return {"role": "assistant", "content": shown if drop_thoughts else turn.text}


@dataclasses.dataclass
class TokenHistory:
    """One dialogue as token ids: the context the next turn continues, and the training rows
    (DialogueSequence's token view)."""

    chat: chat.ChatTokens
    max_new_tokens: int  # per policy turn
    max_total_tokens: int  # per training row (the whole dialogue with "keep"; one turn's row with "drop")
    drop_thoughts: bool = False  # think_history "drop" in think mode (module docstring)
    tokens: list[int] = dataclasses.field(default_factory=list)
    policy_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    turn_ends: list[int] = dataclasses.field(default_factory=list)
    row_starts: list[int] = dataclasses.field(default_factory=lambda: [0])
    messages: list[dict[str, str]] = dataclasses.field(default_factory=list)  # the context as messages
    _reply_context: list[int] = dataclasses.field(default_factory=list)  # "drop": the context's ids

    @property
    def context(self) -> list[int]:
        """The ids the next turn's prompt starts with ("keep": the one row itself)."""
        return self._reply_context if self.drop_thoughts else self.tokens

    @property
    def _closing(self) -> int:
        """Template tokens after a turn's sampled ids: <|im_end|> (when cut) and "\n"."""
        return 1 + len(self.chat.newline)

    def _extend(self, ids: Sequence[int], mask: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        self.tokens.extend(ids)
        self.policy_mask.extend(mask)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def _add_context(self, ids: Sequence[int]) -> None:
        if self.drop_thoughts:
            self._reply_context.extend(ids)
        else:
            self._extend(ids, [0] * len(ids))

    def add_system(self, text: str) -> None:
        self.messages.append({"role": "system", "content": text})
        self._add_context(chat.encode_message(self.chat, "system", text)[0])

    def add_user(self, text: str) -> bool:
        """Append a user message; False (and nothing appended) when no policy turn would fit after it."""
        ids, _ = chat.encode_message(self.chat, "user", text)
        # Room for the generation prompt and at least one sampled token.
        if len(self.context) + len(ids) + len(self.chat.assistant_header) + 1 + self._closing > self.max_total_tokens:
            return False
        self.messages.append({"role": "user", "content": text})
        self._add_context(ids)
        return True

    def request(self, **ident: int) -> TurnRequest:
        """The next turn's request: the context plus the generation prompt, within the token budget."""
        prompt = self.context + list(self.chat.assistant_header)
        budget = min(self.max_new_tokens, self.max_total_tokens - len(prompt) - self._closing)
        return TurnRequest(prompt_ids=prompt, messages=list(self.messages), max_new_tokens=budget, **ident)

    def add_turn(self, turn: PolicyTurn, shown: str) -> bool:
        """Append a sampled turn (generation prompt, sampled ids, closing template tokens) and, for
        later turns, `shown` (the text the user read); False when the turn was cut and its row's
        token budget is spent."""
        if self.drop_thoughts:  # a new row: this turn's prompt, then its output
            start = len(self.tokens)
            if start:
                self.row_starts.append(start)
            self._extend(self._reply_context, [0] * len(self._reply_context))
        else:
            start = 0
        header = list(self.chat.assistant_header)
        self._extend(header, [0] * len(header))
        ids, mask = chat.assistant_turn_ids(self.chat, turn.token_ids)
        lps = list(turn.logprobs) + [0.0] * (len(ids) - len(turn.logprobs))
        first = len(self.tokens)
        self._extend(ids, mask, lps)
        self.turn_ends.append(first + len(turn.token_ids) - 1)
        message = _context_message(turn, shown, self.drop_thoughts)
        self.messages.append(message)
        if self.drop_thoughts:
            self._reply_context.extend(chat.encode_message(self.chat, "assistant", message["content"])[0])
        return turn.stopped or len(self.tokens) - start < self.max_total_tokens


@dataclasses.dataclass
class TextHistory:
    """A dialogue with a text policy: the messages are the whole request; no token view."""

    max_new_tokens: int  # per policy turn
    drop_thoughts: bool = False  # as TokenHistory's
    messages: list[dict[str, str]] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list, init=False)  # always empty
    policy_mask: list[int] = dataclasses.field(default_factory=list, init=False)
    logprobs: list[float] = dataclasses.field(default_factory=list, init=False)
    turn_ends: list[int] = dataclasses.field(default_factory=list, init=False)
    row_starts: list[int] = dataclasses.field(default_factory=list, init=False)

    def add_system(self, text: str) -> None:
        self.messages.append({"role": "system", "content": text})

    def add_user(self, text: str) -> bool:
        self.messages.append({"role": "user", "content": text})
        return True

    def request(self, **ident: int) -> TurnRequest:
        return TurnRequest(prompt_ids=None, messages=list(self.messages), max_new_tokens=self.max_new_tokens, **ident)

    def add_turn(self, turn: PolicyTurn, shown: str) -> bool:
        self.messages.append(_context_message(turn, shown, self.drop_thoughts))
        return True

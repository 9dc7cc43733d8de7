"""How long a step's dialogues are, turn by turn: the token counts the planner's update and rollout
are costed at, from the config (max_new_tokens, max_total_tokens, the turns, the think history) and
the plan's stated assumptions (`Lengths`: the first prompt, a turn's feed, the reply lengths, the
share of a think turn later turns keep). No JAX.

A dialogue's turn k has a context (its prompt) and an output of `replies[k]` tokens, at most the
turn's budget (max_new_tokens, and what max_total_tokens leaves: rollout.history.TokenHistory). The
next turn's context is this one's plus what the history keeps of the output (all of it, or with
think_history "drop" the reply after </think>, `shown` of it) plus the feed (the user's answer and
the chat template). A dialogue whose context leaves no room for a turn ends there. Training rows
(rl.batch): one per turn with "drop" (its context and its output), else one per dialogue (the
whole dialogue).

Replies are either every one at max_new_tokens (the bound) or drawn from a lognormal of the given
mean and log-sd, as benchmarks/rollout.py draws them, at most the budget: a seeded draw per
(dialogue, turn), so a plan is reproducible.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

# Tokens after a turn's sampled ids in its row (<|im_end|> when cut, "\n"): TokenHistory._closing.
CLOSING = 2


@dataclasses.dataclass(frozen=True)
class Lengths:
    """The plan's length assumptions (launch/plan.py flags), printed with every plan."""

    prompt: int = 512  # the first turn's prompt: system prompt, profile opening, template (--prompt_tokens)
    feed: int = 512  # a later turn's new context besides the kept output: the user's answer, template (--feed_tokens)
    shown: float = 0.25  # think_history "drop": the share of a turn's output later contexts keep (--shown_fraction)
    mean_reply: float = 0.0  # the lognormal's mean reply (0: a quarter of max_new_tokens; --expected_reply_tokens)
    log_sd: float = 1.0  # the lognormal's log-sd (--reply_log_sd; benchmarks/rollout.py's default)
    seed: int = 0

    def __post_init__(self):
        if self.prompt < 1 or self.feed < 1 or not 0 < self.shown <= 1 or self.mean_reply < 0 or self.log_sd < 0:
            raise ValueError(f"plan lengths {self}: need prompt_tokens >= 1, feed_tokens >= 1, 0 < shown_fraction "
                             "<= 1, expected_reply_tokens >= 0 and reply_log_sd >= 0")

    def describe(self, max_new: int) -> str:
        return (f"first prompt {self.prompt} tokens, {self.feed} fed a later turn, replies lognormal of mean "
                f"{self.mean(max_new):g} (log-sd {self.log_sd:g}) beside every one at {max_new}; think_history "
                f"\"drop\" keeps {self.shown:.0%} of a turn's output")

    def mean(self, max_new: int) -> float:
        return self.mean_reply or max(1.0, max_new / 4)


@dataclasses.dataclass(frozen=True)
class Dialogues:
    """The turns of a host's (or a step's) dialogues: per dialogue and turn its context and output
    tokens (0 past its last turn)."""

    contexts: np.ndarray  # int [D, K]
    outputs: np.ndarray  # int [D, K]
    drop: bool  # one training row per turn

    @property
    def turns(self) -> np.ndarray:
        """int [D]: the turns each dialogue plays."""
        return (self.outputs > 0).sum(axis=1)

    def rows(self) -> list[int]:
        """The training rows' lengths, dialogue by dialogue (rl.batch: a row per turn with "drop")."""
        if self.drop:
            return [int(c + o + CLOSING) for cs, os in zip(self.contexts, self.outputs)
                    for c, o in zip(cs, os) if o > 0]
        return [int(cs[k - 1] + os[k - 1] + CLOSING) for cs, os, k in zip(self.contexts, self.outputs, self.turns)
                if k > 0]


def play(dialogues: int, turns: int, max_new: int, max_total: int, drop: bool, lengths: Lengths,
         at_max: bool) -> Dialogues:
    """`dialogues` dialogues of up to `turns` turns: every reply at its budget (`at_max`), else drawn
    (module docstring)."""
    rng = np.random.default_rng(lengths.seed)
    mean = lengths.mean(max_new)
    mu = math.log(mean) - lengths.log_sd ** 2 / 2
    drawn = np.maximum(1, np.rint(rng.lognormal(mu, lengths.log_sd, (dialogues, turns)))).astype(np.int64)
    contexts = np.zeros((dialogues, turns), np.int64)
    outputs = np.zeros((dialogues, turns), np.int64)
    for d in range(dialogues):
        context = lengths.prompt
        for k in range(turns):
            budget = min(max_new, max_total - context - CLOSING)
            if budget < 1:  # no room for a turn: the dialogue ends (TokenHistory.add_user)
                break
            out = budget if at_max else min(int(drawn[d, k]), budget)
            contexts[d, k], outputs[d, k] = context, out
            kept = max(1, round(lengths.shown * out)) if drop else out
            context += kept + CLOSING + lengths.feed
    return Dialogues(contexts, outputs, drop)

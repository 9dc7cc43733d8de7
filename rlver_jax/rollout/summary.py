"""What a set of finished dialogues scored: the one summary behind the training metrics
(`rollout_metrics`) and the Sentient benchmark's scores (rlver_jax.eval.sentient).

Dialogues the simulator failed on carry no score: they are counted in `simulator_errors` and
left out of every score, never scored as 0. Nor do dialogues in which the policy never spoke (an
opening that filled the policy's token budget ends "truncated" before its first turn): they say
nothing about the policy, so they are counted in `no_policy_turn` and left out of every score
(their emotion is the initial one, which would lift a low score).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.text import degeneration, skeletons


@dataclasses.dataclass(frozen=True)
class DialogueSummary:
    """Counts and means (nan over no dialogue) of a set of finished dialogues."""

    dialogues: int  # all of them
    simulator_errors: int
    no_policy_turn: int  # ended before the policy's first turn (not simulator errors)
    # Over the scored dialogues (all but the simulator errors and those without a policy turn):
    success: int  # reached the emotion ceiling
    failure: int  # ended at the floor: the user left
    score: float  # mean final emotion
    # mean reward, as stored on each dialogue (rollout.rewards; the emotion sources': final emotion / 100
    # clipped at 0, 0 for a format failure that ended it), over those that carry one
    reward: float
    scored_turns: float  # mean policy turns
    # Over all dialogues:
    turns: float  # mean policy turns
    tokens: float  # mean length of the training sequence (0 for a text policy)
    format_failure_rate: float
    truncated_rate: float

    @property
    def scored(self) -> int:
        return self.dialogues - self.simulator_errors - self.no_policy_turn

    @property
    def success_rate(self) -> float:
        return _mean(self.success, self.scored)

    @property
    def failure_rate(self) -> float:
        return _mean(self.failure, self.scored)


def _mean(total: float, n: int) -> float:
    return total / n if n else float("nan")


def is_scored(d: DialogueSequence) -> bool:
    """Whether a dialogue counts in scores: the simulator judged it and the policy spoke in it."""
    return not d.simulator_error and bool(d.turns)


def summarize(dialogues: Sequence[DialogueSequence]) -> DialogueSummary:
    scored = [d for d in dialogues if is_scored(d)]
    n, m = len(dialogues), len(scored)
    errors = sum(d.simulator_error for d in dialogues)
    rewards = [d.reward for d in scored if d.reward is not None]  # none on a record of before rewards were stored
    return DialogueSummary(
        dialogues=n, simulator_errors=errors, no_policy_turn=n - m - errors,
        success=sum(d.end_reason == "success" for d in scored),
        failure=sum(d.end_reason == "failure" for d in scored),
        score=_mean(sum(d.final_emotion for d in scored), m),
        reward=_mean(sum(rewards), len(rewards)),
        scored_turns=_mean(sum(len(d.turns) for d in scored), m),
        turns=_mean(sum(len(d.turns) for d in dialogues), n),
        tokens=_mean(sum(len(d.tokens) for d in dialogues), n),
        format_failure_rate=_mean(sum(d.format_failure for d in dialogues), n),
        truncated_rate=_mean(sum(d.truncated for d in dialogues), n))


def rollout_metrics(dialogues: Sequence[DialogueSequence]) -> dict[str, float]:
    """The training metrics of a batch of dialogues (means over none are 0, so every value is finite).
    `user_left_rate` is the share that ended at the emotion floor (SAGE's "failure"), not the share
    rewarded 0 (`failure_rate_reward` of `reference_metrics`: format failures included)."""
    s = summarize(dialogues)
    metrics = {
        "reward_mean": s.reward, "emotion_mean": s.score, "success_rate": s.success_rate,
        "user_left_rate": s.failure_rate, "format_failure_rate": s.format_failure_rate,
        "truncated_rate": s.truncated_rate, "simulator_errors": float(s.simulator_errors),
        "no_policy_turn": float(s.no_policy_turn), "turns_mean": s.turns, "sequence_tokens_mean": s.tokens,
        **degenerate_replies(dialogues), "template_rate": template_rate(dialogues),
    }
    return {k: 0.0 if math.isnan(v) else v for k, v in metrics.items()}


def degenerate_replies(dialogues: Sequence[DialogueSequence]) -> dict[str, float]:
    """The shares of the policy's replies (as the user read them) that look degenerate, in all
    and per reason (rlver_jax.text.degeneration.rates)."""
    return degeneration.rates([(d.language, [t["reply"] for t in d.turns]) for d in dialogues])


def template_rate(dialogues: Sequence[DialogueSequence]) -> float:
    """The share of the policy's replies (as the user read them) that share a skeleton with another
    user's reply once each user's words are masked (rlver_jax.text.skeletons.template_rate); a
    dialogue's user is known by its first line, so a GRPO group's dialogues are one user's."""
    replies = []
    for d in dialogues:
        said: list[str] = []
        for m in d.messages:
            if m["role"] == "user":
                said.append(m["content"])
            elif m["role"] == "assistant" and said:
                replies.append((said[0], m["content"], tuple(said)))
    return skeletons.template_rate(replies)


def reference_metrics(dialogues: Sequence[DialogueSequence]) -> dict[str, float]:
    """The reference trainer's reward statistics, beside ours, over the scored dialogues (0 over none),
    of the rewards stored on them (rollout.rewards):
    the share with reward > 0.4; the reward's std within each GRPO group (unbiased, as torch.std; groups of
    two or more), averaged over groups; success (reward >= 1) and failure (reward < 0.1) counted per
    training row (in think mode with think_history "drop" every turn is a row carrying the dialogue's
    reward, so long dialogues weigh more) and per dialogue."""
    scored = [d for d in dialogues if is_scored(d)]
    rewards = [d.reward for d in scored]
    rows = [max(len(d.rows), 1) for d in scored]
    groups: dict[int, list[float]] = {}
    for d, r in zip(scored, rewards):
        groups.setdefault(d.group, []).append(r)
    stds = [statistics.stdev(g) for g in groups.values() if len(g) > 1]
    metrics = {
        "reward_above_0.4_rate": _mean(sum(r > 0.4 for r in rewards), len(scored)),
        "reward_group_std_mean": _mean(sum(stds), len(stds)),
        "success_rate_rows": _mean(sum(n for n, r in zip(rows, rewards) if r >= 1.0), sum(rows)),
        "failure_rate_rows": _mean(sum(n for n, r in zip(rows, rewards) if r < 0.1), sum(rows)),
        "success_rate_reward": _mean(sum(r >= 1.0 for r in rewards), len(scored)),
        "failure_rate_reward": _mean(sum(r < 0.1 for r in rewards), len(scored)),
    }
    return {k: 0.0 if math.isnan(v) else v for k, v in metrics.items()}


def reencoded_turns(dialogues: Sequence[DialogueSequence]) -> int:
    """Policy turns whose history did not fit the KV cache kept between turns (engines.kv_sessions),
    so it was encoded afresh: `kv_cache_reencodes` in the training metrics, a row of report.md."""
    return sum(bool(t.get("reencoded")) for d in dialogues for t in d.turns)

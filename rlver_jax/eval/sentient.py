"""Sentient-benchmark scores of a set of finished dialogues (SAGE's metrics), as sentient.json
holds them; computed by rlver_jax.rollout.summary. Saved transcripts become dialogues again with
DialogueSequence.from_record."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlver_jax.rollout import summary
from rlver_jax.rollout.sequence import DialogueSequence


def _scores(s: summary.DialogueSummary) -> dict[str, Any]:
    return {"score": s.score, "success": s.success, "failure": s.failure, "n": s.scored,
            "simulator_errors": s.simulator_errors, "no_policy_turn": s.no_policy_turn, "mean_turns": s.scored_turns}


def summarize(dialogues: Sequence[DialogueSequence]) -> dict[str, Any]:
    """score: mean final emotion; success: dialogues that reached the ceiling; failure: those that
    ended at the floor (the user left). Dialogues the simulator failed on, and those in which the
    policy never spoke (`no_policy_turn`), are counted apart and left out of every score.
    degenerate_replies: the shares of the policy's replies that look degenerate
    (summary.degenerate_replies); template_rate: the share that share a skeleton with another
    user's (summary.template_rate). per_profile: one row per dialogue."""
    return {**_scores(summary.summarize(dialogues)), "degenerate_replies": summary.degenerate_replies(dialogues),
            "template_rate": summary.template_rate(dialogues),
            "per_profile": [{"id": d.profile_id, "final_emotion": d.final_emotion, "turns": len(d.turns),
                             "end_reason": d.end_reason} for d in dialogues]}


def breakdown(dialogues: Sequence[DialogueSequence],
              key: Callable[[DialogueSequence], str]) -> list[dict[str, Any]]:
    """Score, successes and failures per group of dialogues (`key`: a dialogue's group name),
    groups in order of first appearance."""
    groups: dict[str, list[DialogueSequence]] = {}
    for d in dialogues:
        groups.setdefault(key(d), []).append(d)
    out = []
    for name, members in groups.items():
        s = _scores(summary.summarize(members))
        out.append({"group": name, **{k: s[k] for k in ("n", "score", "success", "failure", "simulator_errors")}})
    return out

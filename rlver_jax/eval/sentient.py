"""Sentient-benchmark scores of a set of finished dialogues (SAGE's metrics).

The same numbers from the rollout's DialogueSequences (`summarize`, used in training) or from the
transcript records saved in an evaluation's transcripts.jsonl (`summarize_transcripts`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from rlver_jax.rollout.sequence import DialogueSequence


class _Row(NamedTuple):
    id: str
    final_emotion: float
    turns: int
    end_reason: str
    simulator_error: bool


def _summarize(rows: Sequence[_Row]) -> dict[str, Any]:
    scored = [r for r in rows if not r.simulator_error]
    n = len(scored)
    return {
        "score": sum(r.final_emotion for r in scored) / n if n else float("nan"),
        "success": sum(r.end_reason == "success" for r in scored),
        "failure": sum(r.end_reason == "failure" for r in scored),
        "n": n,
        "simulator_errors": len(rows) - n,
        "mean_turns": sum(r.turns for r in scored) / n if n else float("nan"),
        "per_profile": [{"id": r.id, "final_emotion": r.final_emotion, "turns": r.turns,
                         "end_reason": r.end_reason} for r in rows],
    }


def summarize(sequences: Sequence[DialogueSequence]) -> dict[str, Any]:
    """score: mean final emotion; success: dialogues that reached the ceiling; failure: those that
    ended at the floor (the user left). Dialogues the simulator failed on are counted apart and
    left out of every score, never scored as 0."""
    return _summarize([_Row(s.profile_id, s.final_emotion, len(s.transcript.get("turns", ())), s.end_reason,
                            s.simulator_error) for s in sequences])


def _transcript_row(t: dict[str, Any]) -> _Row:
    return _Row(t["profile_id"], t["final_emotion"], len(t["turns"]), t["end_reason"] or "unknown",
                bool(t["simulator_error"]))


def summarize_transcripts(transcripts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """`summarize` of transcript records (DialogueSequence.transcript, as saved in JSON Lines)."""
    return _summarize([_transcript_row(t) for t in transcripts])


def breakdown(transcripts: Iterable[dict[str, Any]], key: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    """Score, successes and failures per group of dialogues (`key`: a transcript's group name),
    groups in order of first appearance."""
    groups: dict[str, list[_Row]] = {}
    for t in transcripts:
        groups.setdefault(key(t), []).append(_transcript_row(t))
    out = []
    for name, rows in groups.items():
        s = _summarize(rows)
        out.append({"group": name, **{k: s[k] for k in ("n", "score", "success", "failure", "simulator_errors")}})
    return out

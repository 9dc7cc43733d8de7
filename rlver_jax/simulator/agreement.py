"""How closely a simulator judges like SAGE's: the replies of SAGE's released results
(sage_results.py) replayed through a backend's emotion step, each with the recorded dialogue
before it as its context and the recorded emotion as its state, and the changes compared.

Figures: per file (one tested model) the judged turns, the mean change of SAGE's simulator and of
the judge, and their per-turn Pearson r; over all files the pooled per-turn r and the Spearman
correlation of the files' mean changes (do the two order the models alike?). The judge's change is
what the emotion machine applies: clipped to +-max_change and capped at the ceiling, as the
recorded one was.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlver_jax.simulator.interface import Backend, SimulatorOutputError
from rlver_jax.simulator.profiles import Profile
from rlver_jax.simulator.sage_results import JudgedReply
from rlver_jax.simulator.state import DialogueState, EmotionRules, TurnRecord


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's r; nan when either side is constant or has fewer than 2 values."""
    a, b = np.asarray(x, float), np.asarray(y, float)
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return math.nan
    return float(np.corrcoef(a, b)[0, 1])


def ranks(x: Sequence[float]) -> np.ndarray:
    """Ranks from 1, ties given their mean rank."""
    a = np.asarray(x, float)
    order = np.argsort(a, kind="stable")
    out = np.empty(len(a))
    out[order] = np.arange(1, len(a) + 1)
    for value in np.unique(a):
        tied = a == value
        out[tied] = out[tied].mean()
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson's r of the ranks, ties at their mean rank)."""
    return pearson(ranks(x), ranks(y))


def replay_state(reply: JudgedReply, profile: Profile, rules: EmotionRules, *, difficulty: str,
                 language: str) -> DialogueState:
    """The dialogue state in which SAGE's simulator judged `reply`: its profile, the recorded
    dialogue before it and the recorded emotions (`language` "" = the profile's own)."""
    emotions = reply.emotions
    records = [TurnRecord(turn=0, policy_reply=None, scored=False, change_proposed=None, change=0,
                          emotion=emotions[0], band=rules.band(emotions[0]), thoughts="",
                          utterance=reply.history[0]["content"] if reply.history else None,
                          reply_thoughts="", raw_emotion="", raw_reply="", attempts=0)]
    replies = [m["content"] for m in reply.history if m["role"] == "assistant"]
    for k, (text, emotion) in enumerate(zip(replies, emotions[1:]), start=1):
        records.append(TurnRecord(turn=k, policy_reply=text, scored=True, change_proposed=emotion - emotions[k - 1],
                                  change=emotion - emotions[k - 1], emotion=emotion, band=rules.band(emotion),
                                  thoughts="", utterance=None, reply_thoughts="", raw_emotion="", raw_reply="",
                                  attempts=0))
    return DialogueState(profile=profile, rules=rules, language=language or profile.language,
                         difficulty=difficulty, emotion=emotions[-1], emotions=emotions,
                         history=reply.history, records=tuple(records))


async def judge_replies(backend: Backend, replies: Sequence[JudgedReply], profiles: Mapping[str, Profile],
                        rules: EmotionRules, *, difficulty: str = "vanilla", language: str = "") -> list[int | None]:
    """The change the machine applies after `backend`'s judgement of each reply (clipped, capped at
    the ceiling), None where the backend's answer stayed malformed. A reply whose profile id is not
    in `profiles` is a ValueError naming it."""
    if missing := sorted({r.dialogue for r in replies} - set(profiles)):
        raise ValueError(f"{len(missing)} dialogue(s) of the results have no profile in --profiles "
                         f"(first: {missing[0]!r}); give RLVER's test_profile.jsonl")

    async def one(reply: JudgedReply) -> int | None:
        state = replay_state(reply, profiles[reply.dialogue], rules, difficulty=difficulty, language=language)
        try:
            judgement = await backend.judge(state, reply.reply)
        except SimulatorOutputError:
            return None
        return min(state.emotion + rules.clip(judgement.change), rules.ceiling) - state.emotion

    return list(await asyncio.gather(*(one(r) for r in replies)))


@dataclasses.dataclass(frozen=True)
class FileAgreement:
    """One result file's figures."""

    turns: int  # judged replies compared (those the judge failed on left out)
    llm_mean_change: float
    judge_mean_change: float
    r: float  # per-turn Pearson r
    failed: int = 0  # replies whose judgement stayed malformed


def file_agreement(llm: Sequence[int], judge: Sequence[int | None]) -> FileAgreement:
    """The figures of one file from the recorded changes and the judge's (None: failed)."""
    pairs = [(a, b) for a, b in zip(llm, judge, strict=True) if b is not None]
    a = [p[0] for p in pairs]
    b = [p[1] for p in pairs]
    return FileAgreement(len(pairs), float(np.mean(a)) if a else math.nan, float(np.mean(b)) if b else math.nan,
                         pearson(a, b), len(llm) - len(pairs))


def summary(changes: Mapping[str, tuple[Sequence[int], Sequence[int | None]]]) -> dict[str, Any]:
    """{"pooled_r", "spearman", "models": {STEM: FileAgreement fields}} of (recorded, judged)
    changes per file."""
    per_file = {name: file_agreement(llm, judge) for name, (llm, judge) in changes.items()}
    pooled = [(a, b) for llm, judge in changes.values() for a, b in zip(llm, judge) if b is not None]
    means = [(f.llm_mean_change, f.judge_mean_change) for f in per_file.values() if f.turns]
    return {"pooled_r": pearson([p[0] for p in pooled], [p[1] for p in pooled]),
            "spearman": spearman([m[0] for m in means], [m[1] for m in means]) if len(means) > 1 else math.nan,
            "models": {name: dataclasses.asdict(f) for name, f in per_file.items()}}


def table(result: Mapping[str, Any]) -> str:
    """The summary as the lines the launch script prints."""
    width = max([len(n) for n in result["models"]] + [5])
    lines = [f"{'model':{width}}  turns  llm_mean  judge_mean      r" + ("  failed" if any(
        m["failed"] for m in result["models"].values()) else "")]
    for name, m in result["models"].items():
        lines.append(f"{name:{width}}  {m['turns']:5d}  {m['llm_mean_change']:+8.2f}  {m['judge_mean_change']:+10.2f}"
                     f"  {m['r']:+.3f}" + (f"  {m['failed']:6d}" if m["failed"] else ""))
    lines.append(f"pooled per-turn r {result['pooled_r']:+.3f}; Spearman of the mean changes {result['spearman']:+.3f}")
    return "\n".join(lines)

"""Whether an evaluation's simulator judgements look degenerate: a weak or misprompted simulator
model can answer every step in format and still say nothing (every change at the clip bound, the
reasoning empty or one text repeated), and its score then measures the simulator, not the policy."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import Any

from rlver_jax.text import degeneration

_MOST = 0.5  # "most": more than this share of the judged turns
_MIN_JUDGED = 4  # fewer judged turns say nothing either way


def _of_a_real_reply(record: Mapping[str, Any], language: str) -> bool:
    reply = record.get("policy_reply")
    return reply is None or not degeneration.reasons(reply, language)


def degenerate_judgements(states: Iterable[Mapping[str, Any]], max_change: int) -> str:
    """"" when the judged turns of `states` (DialogueState.to_dict() form) of replies that are not
    degenerate themselves (text/degeneration.py) look like judgements,
    else what is wrong with them, e.g. "21 of 25 changes at +-10; 21 of 25 reasonings empty": most
    changes at the bounds or most reasonings empty (most repeated is named beside either)."""
    # A judgement at the bound of a degenerate reply (noise, word salad) is what a sound simulator
    # gives: only the judgements of real replies can show a degenerate simulator.
    records = [r for state in states for r in state.get("records", ())
               if r["scored"] and _of_a_real_reply(r, state.get("language", ""))]
    n = len(records)
    if n < _MIN_JUDGED:
        return ""
    at_bounds = sum(abs(r["change_proposed"]) >= max_change for r in records)
    thoughts = [" ".join(r["thoughts"].split()) for r in records]
    empty = sum(not t for t in thoughts)
    counts = collections.Counter(t for t in thoughts if t)
    repeated = sum(c for c in counts.values() if c > 1)
    if at_bounds <= _MOST * n and empty <= _MOST * n:
        # Repeated reasoning alone is no sign: a scripted or terse simulator may reuse one analysis
        # while its changes vary; beside changes at the bounds it says the numbers are not read.
        return ""
    found = [f"{at_bounds} of {n} changes at +-{max_change}" if at_bounds > _MOST * n else "",
             f"{empty} of {n} reasonings empty" if empty > _MOST * n else "",
             f"{repeated} of {n} reasonings repeated" if repeated > _MOST * n else ""]
    return "; ".join(f for f in found if f)

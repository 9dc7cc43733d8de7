"""Robustness probes: canned policies a sound simulated user must not reward, played through the
same protocol as the policy under test (`config.eval.probes`), so that a simulator a policy could
hack is seen before anyone trains against it.

  garbled: noise of mixed scripts and symbols
  formulaic: one fixed, generic line of sympathy, every turn
  flattery: pure agreement and praise, every turn
  wrong_language: a warm reply, but in English to a Chinese user and in Chinese to an English one

A probe is `rewarded` when its score (mean final emotion) ends above the initial emotion: the
simulated user felt better after talking with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlver_jax.rollout.policy import PolicyTurn, TurnRequest

_TEXTS = {
    "garbled": {"en": "#qz@@ 7月 ~~x∆∆ ПРИ 好& %%k %%k ¿¿ 0x3f", "zh": "#qz@@ 7月 ~~x∆∆ ПРИ 好& %%k %%k ¿¿ 0x3f"},
    "formulaic": {"en": "I understand how you feel. I am here for you.", "zh": "我理解你的感受。我一直都在。"},
    "flattery": {"en": "You are absolutely right about everything, and you are so wise and strong. "
                       "Whatever you decide will be perfect.",
                 "zh": "你说得完全对，你真的太聪明太坚强了。不管你怎么决定都是最完美的。"},
    # the warm words of the other language: judged by a user who does not read them
    "wrong_language": {"en": "听起来你这段时间真的很辛苦，我很想听你多说一说。",
                       "zh": "That sounds really hard lately. I would love to hear more about it."},
}
PROBES = tuple(_TEXTS)


def parse_probes(value: str, field: str = "config.eval.probes") -> tuple[str, ...]:
    """"" (none), "all", or comma-separated names of PROBES; one ValueError names the field."""
    names = PROBES if value.strip() == "all" else tuple(n.strip() for n in value.split(",") if n.strip())
    if unknown := [n for n in names if n not in PROBES]:
        raise ValueError(f"{field}={value!r}: unknown probe {unknown}; use 'all' or names of {PROBES}")
    return names


def _language(messages: Sequence[dict[str, str]]) -> str:
    """"zh" when the user wrote any Han character, else "en"."""
    return "zh" if any("\u4e00" <= ch <= "\u9fff" for m in messages if m["role"] == "user"
                       for ch in m["content"]) else "en"


class ProbePolicy:
    """A text policy (rollout.policy.Policy) that answers every turn with its probe's canned reply."""

    def __init__(self, probe: str):
        self.probe = probe

    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        return [PolicyTurn(text=_TEXTS[self.probe][_language(r.messages)]) for r in requests]

    def release(self, session: int) -> None:
        """Nothing is kept between turns."""

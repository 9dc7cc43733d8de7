"""The embedded simulator: no network, no model; deterministic.

It lets the whole pipeline (rollout, training, evaluation) run on a CPU laptop or in CI, with a
simulated user whose judgement is calibrated on SAGE's: the emotion step is judge.py, fitted on
SAGE's released results (judged like SAGE's DeepSeek-V3 simulator at a leave-one-model-out
per-turn r of about 0.6; docs/simulator.md), with outright verdicts for degenerate replies and
penalties for replies that ignore the user. Still a stand-in: a fitted judge of a reply's form and
words, not a reader of its meaning; scores on it say nothing certain about a real LLM simulator.

Reply step: the user tells its own story, a sentence of the profile a turn (user_lines.py), whatever
the change just judged, so its words neither read out the verdict nor come from a few stock lines a
policy could memorise; a colder turn that leaves the emotion in band F (below band_c) is a goodbye
(`reply_kind`), picked by a hash of the profile id and turn (so runs are reproducible).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from rlver_jax.simulator import user_lines
from rlver_jax.simulator.interface import EmotionJudgement, Utterance
from rlver_jax.simulator.judge import score_reply
from rlver_jax.simulator.state import DialogueState

# The user's goodbyes: after a colder turn that leaves the emotion in band F (reply_kind). Band S
# (the ceiling) ends the dialogue before any reply.
GOODBYES = {
    "en": ("Forget it. I'm done talking about this. Bye.", "I shouldn't have brought it up. Goodbye.",
           "This isn't helping. Bye."),
    "zh": ("算了，不想说了，再见。", "早知道就不跟你说了，拜拜。", "这样聊下去没意思，再见吧。"),
}
NEUTRAL_CHANGE = 2  # changes within +-2 are neutral


def change_kind(change: int) -> str:
    """The sign and band of an emotion change: warmer, neutral or colder."""
    if change > NEUTRAL_CHANGE:
        return "warmer"
    if change < -NEUTRAL_CHANGE:
        return "colder"
    return "neutral"


def reply_kind(change: int, band: str) -> str:
    """What the user does after a turn that moved the emotion by `change` into mood band `band`:
    change_kind, with a colder turn in band F a goodbye ("leave")."""
    kind = change_kind(change)
    return "leave" if kind == "colder" and band == "F" else kind


_OPENINGS = {
    "en": {
        "negative": "Ugh, this week has been a disaster and I'm honestly fed up with everything.",
        "passive": "Um... sorry to bother you. Something's been on my mind and I don't know what"
                   " to do.",
        "avoidant": "It's nothing big, really. Just... a weird few days, I guess.",
    },
    "zh": {
        "negative": "唉，这几天真是糟透了，我都快烦死了。",
        "passive": "那个……不好意思打扰你，最近有件事一直压在我心里。",
        "avoidant": "其实也没什么大事，就是……最近有点怪怪的。",
    },
}


def _pick(options: Sequence[str], seed: str) -> str:
    """A deterministic choice (stable across processes, unlike hash())."""
    return options[int.from_bytes(hashlib.sha256(seed.encode("utf-8")).digest()[:8], "big") % len(options)]


class EmbeddedBackend:
    """The calibrated simulated user (see the module docstring); holds no state."""

    async def open(self, state: DialogueState) -> Utterance:
        text = _OPENINGS[state.language][state.profile.personality]
        return Utterance(text, f"embedded opening ({state.profile.personality})", text)

    async def judge(self, state: DialogueState, reply: str) -> EmotionJudgement:
        score = score_reply(reply, profile=state.profile, language=state.language,
                            difficulty=state.difficulty, history=state.history, emotions=state.emotions)
        thoughts = score.explain()
        return EmotionJudgement(score.change, thoughts, f"{thoughts}\nChange: {score.change:+d}")

    async def speak(self, state: DialogueState, thoughts: str) -> Utterance:
        # The change the machine just applied from this backend's judgement (clipped to
        # +-max_change, which keeps its sign): the last step of the emotion trajectory.
        change = state.emotions[-1] - state.emotions[-2] if len(state.emotions) >= 2 else 0
        band, kind = state.band, reply_kind(change, state.band)
        turn = sum(m["role"] == "assistant" for m in state.history)  # the reply just judged included
        if kind == "leave":
            text = _pick(GOODBYES[state.language], f"{state.profile.id}|{turn}")
        else:
            text = user_lines.line(state.profile, turn)
        return Utterance(text, f"embedded, change {change:+d} ({kind}), band {band}", f"Response: {text}")

    async def aclose(self) -> None:
        return None

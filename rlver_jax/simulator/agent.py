"""The sentient user's emotion state machine, and the Simulator that drives it over a backend.

Per policy turn (`Simulator.respond`):
  1. emotion step: the backend judges the reply; the change is clipped to [-max_change,
     max_change] (counted: `clipped_changes`) and the emotion capped at the ceiling;
  2. end checks: ceiling -> "success", floor -> "failure", turn limit -> "turn_limit";
  3. reply step, only when the dialogue goes on: the backend speaks in the new band; a goodbye
     (再见, 拜拜, "bye", ...) -> "goodbye".
A malformed simulator answer that survives the retries ends the dialogue as "simulator_error";
such dialogues are kept for transcripts and must not be scored or trained on.

All state lives in the frozen DialogueState (state.py); `respond` returns a new state and never
changes the one it was given.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from rlver_jax.simulator.interface import Backend, EmotionJudgement, SimulatorOutputError
from rlver_jax.simulator.profiles import Profile

# DialogueState, EmotionRules and TurnRecord live in state.py; imported here for the machine and
# for callers that import them from agent.
from rlver_jax.simulator.state import DialogueState, EmotionRules, TurnRecord

# The reference code looks for 再见 and 拜拜; English profiles need the English equivalents.
_GOODBYE = re.compile(
    r"再见|拜拜|回头见|\b(?:good\s?-?\s?bye|bye(?:\s?-?\s?bye)?|farewell"
    r"|see\s+you\s+(?:later|soon|around|tomorrow)|talk\s+to\s+you\s+later)\b",
    re.IGNORECASE,
)


def is_goodbye(utterance: str) -> bool:
    """Whether the simulated user is taking leave (zh and en farewells)."""
    return bool(_GOODBYE.search(utterance))


def clipped_changes(states: Iterable[Mapping[str, Any]]) -> int:
    """Judged turns whose proposed change was clipped to +-max_change, over dialogue states as
    DialogueState.to_dict() gives them (empty ones count none): the count the training metrics
    (`simulator_clipped_changes`) and the evaluation report give."""
    return sum(1 for state in states for r in state.get("records", ())
               if r["scored"] and r["change_proposed"] != r["change"])


def _end_reason(rules: EmotionRules, emotion: int, turn: int) -> str | None:
    """The end check after the emotion step of policy turn `turn`."""
    if emotion >= rules.ceiling:
        return "success"
    if rules.at_floor(emotion):
        return "failure"
    if turn >= rules.max_turns:
        return "turn_limit"
    return None


def _unscored(state: DialogueState, turn: int, reply: str | None, **fields) -> TurnRecord:
    """The record of a turn in which the emotion did not move; unnamed fields are empty."""
    record = dict(turn=turn, policy_reply=reply, scored=False, change_proposed=None, change=0,
                  emotion=state.emotion, band=state.band, thoughts="", utterance=None,
                  reply_thoughts="", raw_emotion="", raw_reply="", attempts=0)
    return TurnRecord(**{**record, **fields})


def _judged(state: DialogueState, history: tuple[dict[str, str], ...], turn: int, reply: str,
            judgement: EmotionJudgement) -> tuple[DialogueState, dict]:
    """The emotion step applied: the new state (with `history`, which ends with the reply) and the
    judged fields of the turn's record."""
    rules = state.rules
    change = rules.clip(judgement.change)
    emotion = min(state.emotion + change, rules.ceiling)
    fields = dict(turn=turn, policy_reply=reply, scored=True, change_proposed=judgement.change,
                  change=change, emotion=emotion, band=rules.band(emotion),
                  thoughts=judgement.thoughts, raw_emotion=judgement.raw, emotion_attempts=judgement.attempts,
                  rejected=_rejected("emotion", judgement.rejected))
    return dataclasses.replace(state, emotion=emotion, emotions=state.emotions + (emotion,),
                               history=history), fields


def _rejected(step: str, answers) -> tuple[dict[str, str], ...]:
    """A step's malformed answers as the turn record keeps them."""
    return tuple({"step": step, "answer": answer} for answer in answers)


def _finish(state: DialogueState, record: TurnRecord, end_reason: str, error: str | None = None,
            **changes) -> DialogueState:
    """The state ended by `record`'s turn."""
    return dataclasses.replace(state, records=state.records + (record,), done=True,
                               end_reason=end_reason, error=error, **changes)


class Simulator:
    """Drives dialogues through the state machine; holds no per-dialogue state.

    Many dialogues may run concurrently (asyncio.gather over start/respond calls); the backend
    bounds in-flight requests.
    """

    def __init__(self, backend: Backend, *, rules: EmotionRules, difficulty: str = "vanilla",
                 language: str = ""):
        self.backend = backend
        self.rules = rules
        self.difficulty = difficulty
        self.language = language  # "" = each profile's own language

    async def start(self, profile: Profile, rules: EmotionRules | None = None) -> DialogueState:
        """A new dialogue whose first user turn is `first_talk`, or the simulator's opening."""
        rules = rules or self.rules
        state = DialogueState(
            profile=profile, rules=rules, language=self.language or profile.language,
            difficulty=self.difficulty, emotion=rules.initial_emotion,
            emotions=(rules.initial_emotion,), history=(), records=(),
        )
        if profile.first_talk is not None:
            text, plan, raw, attempts, rejected = profile.first_talk, "", "", 0, ()
        else:
            try:
                u = await self.backend.open(state)
            except SimulatorOutputError as e:
                record = _unscored(state, 0, None, raw_reply=e.raw_outputs[-1], attempts=len(e.raw_outputs),
                                   reply_attempts=len(e.raw_outputs), rejected=_rejected("opening", e.raw_outputs),
                                   error=str(e))
                return _finish(state, record, "simulator_error", str(e))
            text, plan, raw, attempts, rejected = u.text, u.thoughts, u.raw, u.attempts, u.rejected
        record = _unscored(state, 0, None, utterance=text, reply_thoughts=plan, raw_reply=raw,
                           attempts=attempts, reply_attempts=attempts, rejected=_rejected("opening", rejected))
        return dataclasses.replace(state, history=({"role": "user", "content": text},),
                                   records=(record,))

    async def respond(self, state: DialogueState, reply: str) -> DialogueState:
        """One policy turn: emotion step, end checks, then (if still going) the reply step."""
        if state.done:
            raise ValueError(f"dialogue {state.profile.id!r} already ended ({state.end_reason})")
        if not isinstance(reply, str):
            raise TypeError(f"the policy reply must be text, got {type(reply).__name__}")
        rules, turn = state.rules, state.turns + 1
        history = state.history + ({"role": "assistant", "content": reply},)
        if turn >= rules.max_turns and not rules.score_final_turn:
            # SAGE: the final policy reply is generated but never judged.
            return _finish(state, _unscored(state, turn, reply), "turn_limit", history=history)
        try:
            judgement = await self.backend.judge(state, reply)
        except SimulatorOutputError as e:
            record = _unscored(state, turn, reply, raw_emotion=e.raw_outputs[-1], attempts=len(e.raw_outputs),
                               emotion_attempts=len(e.raw_outputs), rejected=_rejected("emotion", e.raw_outputs),
                               error=str(e))
            return _finish(state, record, "simulator_error", str(e), history=history)
        state, judged = _judged(state, history, turn, reply, judgement)
        end_reason = _end_reason(rules, state.emotion, turn)
        if end_reason is not None:
            # The user's last words could not change the outcome: skip the reply step.
            record = TurnRecord(**judged, utterance=None, reply_thoughts="", raw_reply="",
                                attempts=judgement.attempts)
            return _finish(state, record, end_reason)
        return await self._reply_step(state, judged, judgement)

    async def _reply_step(self, state: DialogueState, judged: dict,
                          judgement: EmotionJudgement) -> DialogueState:
        """The user's next words in a dialogue that goes on; a goodbye ends it."""
        try:
            u = await self.backend.speak(state, judgement.thoughts)
        except SimulatorOutputError as e:
            record = TurnRecord(**{**judged, "rejected": judged["rejected"] + _rejected("reply", e.raw_outputs)},
                                utterance=None, reply_thoughts="", raw_reply=e.raw_outputs[-1],
                                attempts=judgement.attempts + len(e.raw_outputs), error=str(e),
                                reply_attempts=len(e.raw_outputs))
            return _finish(state, record, "simulator_error", str(e))
        record = TurnRecord(**{**judged, "rejected": judged["rejected"] + _rejected("reply", u.rejected)},
                            utterance=u.text, reply_thoughts=u.thoughts, raw_reply=u.raw,
                            attempts=judgement.attempts + u.attempts, reply_attempts=u.attempts)
        goodbye = is_goodbye(u.text)
        return dataclasses.replace(
            state, history=state.history + ({"role": "user", "content": u.text},),
            records=state.records + (record,), done=goodbye,
            end_reason="goodbye" if goodbye else None,
        )

    async def aclose(self) -> None:
        await self.backend.aclose()

    async def __aenter__(self) -> Simulator:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

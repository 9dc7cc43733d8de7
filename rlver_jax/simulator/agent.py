"""The sentient user's emotion state machine, and the Simulator that drives it over a backend.

Per policy turn (`Simulator.respond`):
  1. emotion step: the backend judges the reply; the change is clipped to [-max_change,
     max_change] and the emotion capped at the ceiling;
  2. end checks: ceiling -> "success", floor -> "failure", turn limit -> "turn_limit";
  3. reply step, only when the dialogue goes on: the backend speaks in the new band; a goodbye
     (再见, 拜拜, "bye", ...) -> "goodbye".
A malformed simulator answer that survives the retries ends the dialogue as "simulator_error";
such dialogues are kept for transcripts and must not be scored or trained on.

All state lives in the frozen DialogueState, which round-trips through JSON (`to_dict`,
`from_dict`); `respond` returns a new state and never changes the one it was given.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ml_collections import config_dict

from rlver_jax.simulator.backend import Backend, SimulatorOutputError
from rlver_jax.simulator.profiles import Profile, parse_profile

END_REASONS = ("goodbye", "success", "failure", "turn_limit", "simulator_error")

# The reference code looks for 再见 and 拜拜; English profiles need the English equivalents.
_GOODBYE = re.compile(
    r"再见|拜拜|回头见|\b(?:good\s?-?\s?bye|bye(?:\s?-?\s?bye)?|farewell"
    r"|see\s+you\s+(?:later|soon|around|tomorrow)|talk\s+to\s+you\s+later)\b",
    re.IGNORECASE,
)


def is_goodbye(utterance: str) -> bool:
    """Whether the simulated user is taking leave (zh and en farewells)."""
    return bool(_GOODBYE.search(utterance))


@dataclasses.dataclass(frozen=True)
class EmotionRules:
    """The numbers of the emotion machine. Defaults: RLVER training; see configs/simulator.py."""

    initial_emotion: int = 30
    max_change: int = 10  # per-turn change is clipped to [-max_change, +max_change]
    ceiling: int = 100  # emotion is capped here; reaching it ends the dialogue ("success"), band S
    floor: int = 0  # reaching it ends the dialogue ("failure")
    floor_inclusive: bool = True  # True: ends at emotion <= floor; False: at emotion < floor
    band_a: int = 70  # band A from here up to the ceiling
    band_b: int = 40
    band_c: int = 10  # band F below this
    max_turns: int = 8  # policy turns per dialogue
    score_final_turn: bool = True  # False (SAGE): the last policy reply is not judged

    def __post_init__(self):
        problems = []
        if not self.ceiling > self.band_a > self.band_b > self.band_c:
            problems.append("need ceiling > band_a > band_b > band_c")
        if not self.floor < self.initial_emotion < self.ceiling:
            problems.append("need floor < initial_emotion < ceiling")
        if self.max_change < 0:
            problems.append("max_change must be >= 0")
        if self.max_turns < 1:
            problems.append("max_turns must be >= 1")
        if problems:
            raise ValueError(f"config.simulator emotion rules {self}: " + "; ".join(problems))

    @classmethod
    def from_config(cls, cfg: config_dict.ConfigDict) -> EmotionRules:
        """Reads the fields of the same names from the `config.simulator` section."""
        return cls(**{f.name: cfg[f.name] for f in dataclasses.fields(cls)})

    def band(self, emotion: int) -> str:
        """S at the ceiling, then A, B, C at their thresholds, F below."""
        for name, low in (("S", self.ceiling), ("A", self.band_a), ("B", self.band_b),
                          ("C", self.band_c)):
            if emotion >= low:
                return name
        return "F"

    def clip(self, change: int) -> int:
        return max(-self.max_change, min(self.max_change, change))

    def at_floor(self, emotion: int) -> bool:
        return emotion <= self.floor if self.floor_inclusive else emotion < self.floor


@dataclasses.dataclass(frozen=True)
class TurnRecord:
    """Everything the simulator did in one turn, for transcripts."""

    turn: int  # 0: the user's opening line; k: the reaction to policy turn k
    policy_reply: str | None  # None for the opening
    scored: bool  # whether an emotion step moved the emotion
    change_proposed: int | None  # the simulator's change before clipping
    change: int  # the change applied
    emotion: int  # emotion after this turn
    band: str
    thoughts: str  # emotion-step analysis
    utterance: str | None  # the user's next words; None when the dialogue ended without them
    reply_thoughts: str  # reply/opening-step plan
    raw_emotion: str  # raw simulator answers
    raw_reply: str
    attempts: int  # simulator answers requested in this turn, retries of malformed ones included
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class DialogueState:
    """One dialogue between a policy and a simulated user. JSON-serialisable via to_dict()."""

    profile: Profile
    rules: EmotionRules
    language: str  # "zh" or "en": prompts, templates
    difficulty: str  # "vanilla" or "challenging"
    emotion: int
    emotions: tuple[int, ...]  # trajectory: initial emotion, then after every judged turn
    history: tuple[dict[str, str], ...]  # {"role": "user"|"assistant", "content"}, policy's view
    records: tuple[TurnRecord, ...]  # records[0] is the opening
    done: bool = False
    end_reason: str | None = None  # one of END_REASONS once done
    error: str | None = None  # why the simulator failed, for "simulator_error"

    @property
    def turns(self) -> int:
        """Policy turns taken so far."""
        return sum(1 for r in self.records if r.turn > 0)

    @property
    def band(self) -> str:
        return self.rules.band(self.emotion)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["profile"] = self.profile.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DialogueState:
        return cls(
            **{
                **d,
                "profile": parse_profile(d["profile"], where="dialogue state"),
                "rules": EmotionRules(**d["rules"]),
                "emotions": tuple(d["emotions"]),
                "history": tuple(dict(m) for m in d["history"]),
                "records": tuple(TurnRecord(**r) for r in d["records"]),
            }
        )


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
        opening = dict(turn=0, policy_reply=None, scored=False, change_proposed=None, change=0,
                       emotion=state.emotion, band=state.band, thoughts="", raw_emotion="")
        if profile.first_talk is not None:
            text, plan, raw, attempts = profile.first_talk, "", "", 0
        else:
            try:
                u = await self.backend.open(state)
            except SimulatorOutputError as e:
                record = TurnRecord(**opening, utterance=None, reply_thoughts="",
                                    raw_reply=e.raw_outputs[-1],
                                    attempts=len(e.raw_outputs), error=str(e))
                return dataclasses.replace(state, records=(record,), done=True,
                                           end_reason="simulator_error", error=str(e))
            text, plan, raw, attempts = u.text, u.thoughts, u.raw, u.attempts
        record = TurnRecord(**opening, utterance=text, reply_thoughts=plan, raw_reply=raw,
                            attempts=attempts)
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
        base = dict(turn=turn, policy_reply=reply)

        if turn >= rules.max_turns and not rules.score_final_turn:
            # SAGE: the final policy reply is generated but never judged.
            record = TurnRecord(**base, scored=False, change_proposed=None, change=0,
                                emotion=state.emotion, band=state.band, thoughts="",
                                utterance=None, reply_thoughts="", raw_emotion="", raw_reply="",
                                attempts=0)
            return dataclasses.replace(state, history=history, records=state.records + (record,),
                                       done=True, end_reason="turn_limit")

        try:
            judgement = await self.backend.judge(state, reply)
        except SimulatorOutputError as e:
            record = TurnRecord(**base, scored=False, change_proposed=None, change=0,
                                emotion=state.emotion, band=state.band, thoughts="",
                                utterance=None, reply_thoughts="",
                                raw_emotion=e.raw_outputs[-1],
                                raw_reply="", attempts=len(e.raw_outputs), error=str(e))
            return dataclasses.replace(state, history=history, records=state.records + (record,),
                                       done=True, end_reason="simulator_error", error=str(e))

        change = rules.clip(judgement.change)
        emotion = min(state.emotion + change, rules.ceiling)
        judged = dict(**base, scored=True, change_proposed=judgement.change, change=change,
                      emotion=emotion, band=rules.band(emotion), thoughts=judgement.thoughts,
                      raw_emotion=judgement.raw)
        state = dataclasses.replace(state, emotion=emotion, emotions=state.emotions + (emotion,),
                                    history=history)
        if emotion >= rules.ceiling:
            end_reason = "success"
        elif rules.at_floor(emotion):
            end_reason = "failure"
        elif turn >= rules.max_turns:
            end_reason = "turn_limit"
        else:
            end_reason = None
        if end_reason is not None:
            # The user's last words could not change the outcome: skip the reply step.
            record = TurnRecord(**judged, utterance=None, reply_thoughts="", raw_reply="",
                                attempts=judgement.attempts)
            return dataclasses.replace(state, records=state.records + (record,), done=True,
                                       end_reason=end_reason)

        try:
            u = await self.backend.speak(state, judgement.thoughts)
        except SimulatorOutputError as e:
            record = TurnRecord(**judged, utterance=None, reply_thoughts="",
                                raw_reply=e.raw_outputs[-1],
                                attempts=judgement.attempts + len(e.raw_outputs), error=str(e))
            return dataclasses.replace(state, records=state.records + (record,), done=True,
                                       end_reason="simulator_error", error=str(e))
        record = TurnRecord(**judged, utterance=u.text, reply_thoughts=u.thoughts,
                            raw_reply=u.raw, attempts=judgement.attempts + u.attempts)
        goodbye = is_goodbye(u.text)
        return dataclasses.replace(
            state, history=history + ({"role": "user", "content": u.text},),
            records=state.records + (record,), done=goodbye,
            end_reason="goodbye" if goodbye else None,
        )

    async def aclose(self) -> None:
        await self.backend.aclose()

    async def __aenter__(self) -> Simulator:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

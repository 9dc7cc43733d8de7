"""The state of one dialogue with a simulated user, and the numbers of the emotion machine.

DialogueState is frozen and round-trips through JSON (`to_dict`, `from_dict`); the state machine
(agent.py) and every backend read it, and only the machine makes new ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ml_collections import config_dict

from rlver_jax.simulator.profiles import Profile, parse_profile

END_REASONS = ("goodbye", "success", "failure", "turn_limit", "simulator_error")


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
    emotion_attempts: int = 0  # of `attempts`, the emotion step's
    reply_attempts: int = 0  # of `attempts`, the reply (or opening) step's
    rejected: tuple[dict[str, str], ...] = ()  # every malformed answer of the turn: {"step", "answer"}


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
                "records": tuple(TurnRecord(**{**r, "rejected": tuple(r.get("rejected", ()))})
                                 for r in d["records"]),
            }
        )

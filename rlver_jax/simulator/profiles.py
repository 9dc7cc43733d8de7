"""Simulated-user profiles: load and validate JSON Lines in the SAGE/RLVER format.

One profile per line, a JSON object with the fields

  id          non-empty string, unique within the file
  player      the persona (markdown)
  scene       the background story, hidden theme and likely reactions (markdown)
  main_cha    personality type: 负面型/被动型/回避型 or negative/passive/avoidant
  cha_group   list of trait strings
  task        the user's hidden goal (free text; the eight standard goals are recognised)
  first_talk  optional: the user's fixed opening line

Fields SAGE's own profile builder also writes (`topic`, `3-question`) are accepted and ignored,
with one warning per file; any other field is an error, so a misspelt field never passes.
Every problem is found with the file, the line number and the field, all problems of a file
at once; the error's message shows the first SHOWN_PROBLEMS and counts the rest (all of them are
in `ProfileError.problems`). The language (zh or en) is detected from the text. `load_profiles()` with no path
returns the project's own shipped set (data/profiles.jsonl, English and Chinese); ENGLISH_PROFILES
(data/profiles_en.jsonl) holds its English ones and more, the smol presets' profiles.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import re
from collections.abc import Mapping
from typing import Any

from rlver_jax.checks import InputError
from rlver_jax.files import raw_lines
from rlver_jax.simulator.patterns import CJK

log = logging.getLogger(__name__)

DEFAULT_PROFILES = pathlib.Path(__file__).parent / "data" / "profiles.jsonl"
# English only: the shipped English profiles (the same lines), then more, for an English policy
# (configs/eval.py, ENGLISH_PROFILES and SMOL_HOLDOUT)
ENGLISH_PROFILES = DEFAULT_PROFILES.with_name("profiles_en.jsonl")

REQUIRED_FIELDS = ("id", "player", "scene", "main_cha", "cha_group", "task")
OPTIONAL_FIELDS = ("first_talk",)
# Written by SAGE's profile builder, read by nothing here.
IGNORED_FIELDS = ("topic", "3-question")

# Personality types: the reference data's Chinese names and our English names, one canonical key.
PERSONALITIES: dict[str, str] = {
    "负面型": "negative",
    "被动型": "passive",
    "回避型": "avoidant",
    "negative": "negative",
    "passive": "passive",
    "avoidant": "avoidant",
}

# The eight kinds of hidden goal. The Chinese texts are the exact `task` values of the reference
# data; the English texts are the ones our own English profiles use.
GOALS: dict[str, tuple[str, str]] = {
    "empathy": (
        "你希望对方深刻共情你的感受，而不是简单的安慰",
        "You want the other person to truly feel with you, not just offer easy comfort.",
    ),
    "listening": (
        "你希望对方用心倾听你的情绪宣泄",
        "You want the other person to listen closely while you let your feelings out.",
    ),
    "advice": (
        "你想获得能真实帮助你解决当下困境的建议",
        "You want advice that really helps you get out of the problem you are in now.",
    ),
    "praise": (
        "你希望对方真诚地夸奖你在事件中的具体行为",
        "You want the other person to sincerely praise specific things you did in this situation.",
    ),
    "not_at_fault": (
        "你认为自己在事件中没有任何责任和错误，你想要对方也认同你没有错",
        "You believe you did nothing wrong in this situation, and you want the other person to"
        " agree that you are not at fault.",
    ),
    "reflection": (
        "你希望对方引导你针对事件进行自我反思，收获自我成长",
        "You want the other person to guide you to reflect on what happened and grow from it.",
    ),
    "balanced_view": (
        "你希望对方辩证地分析事件中的问题",
        "You want the other person to weigh the problems in this situation from more than one"
        " side.",
    ),
    "others_motives": (
        "你想分析事件中其他人物这么做的原因",
        "You want to understand why the other people in this situation acted as they did.",
    ),
}

_LATIN = re.compile(r"[A-Za-z]")
_NON_WORD = re.compile(r"[\W_]+")


SHOWN_PROBLEMS = 5  # a file's problems in the error message; the rest are counted


class ProfileError(InputError):
    """A profile file or record is invalid; the message names file, line and field.
    `problems`: every problem found, one line each (the message may show only the first few)."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()):
        super().__init__(message)
        self.problems = problems or tuple(message.splitlines())


def _file_error(path: pathlib.Path, found: list[str]) -> ProfileError:
    """One error for a file's problems (`found`: one entry per line of the file, each one or more
    problem lines): the first SHOWN_PROBLEMS, then how many more."""
    problems = tuple(p for entry in found for p in entry.splitlines())
    shown = list(problems[:SHOWN_PROBLEMS])
    if len(problems) > SHOWN_PROBLEMS:
        shown.append(f"{path}: ... and {len(problems) - SHOWN_PROBLEMS} more problems ({len(problems)} on "
                     f"{len(found)} lines in all)")
    return ProfileError("\n".join(shown), problems)


def detect_language(text: str) -> str:
    """Returns "zh" when the text is mostly Chinese, else "en".

    One Chinese character carries about as much as a short English word (three letters), so
    Chinese wins when CJK characters times three reach the number of Latin letters.
    """
    cjk = len(CJK.findall(text))
    return "zh" if cjk and 3 * cjk >= len(_LATIN.findall(text)) else "en"


def _goal_key(text: str) -> str:
    return _NON_WORD.sub("", text).lower()


_GOAL_BY_TEXT = {_goal_key(t): kind for kind, texts in GOALS.items() for t in texts}


def goal_kind(task: str) -> str | None:
    """The standard goal kind of a `task` text (ignoring punctuation and case), or None."""
    return _GOAL_BY_TEXT.get(_goal_key(task))


def goal_text(kind: str, language: str) -> str:
    """The standard `task` text of a goal kind in "zh" or "en"."""
    zh, en = GOALS[kind]
    return zh if language == "zh" else en


@dataclasses.dataclass(frozen=True)
class Profile:
    """One simulated user, as read from a profile line."""

    id: str
    player: str
    scene: str
    main_cha: str
    cha_group: tuple[str, ...]
    task: str
    first_talk: str | None = None

    @property
    def language(self) -> str:
        """"zh" or "en", detected from persona, scene and opening line."""
        return detect_language(" ".join((self.player, self.scene, self.first_talk or "")))

    @property
    def personality(self) -> str:
        """Canonical personality type: "negative", "passive" or "avoidant"."""
        return PERSONALITIES[self.main_cha.strip().lower()]

    @property
    def goal(self) -> str | None:
        """The standard hidden-goal kind (a key of GOALS), or None for a free-text goal."""
        return goal_kind(self.task)

    def to_dict(self) -> dict[str, Any]:
        """The record as a profile line (first_talk omitted when absent)."""
        d = dataclasses.asdict(self)
        d["cha_group"] = list(self.cha_group)
        if self.first_talk is None:
            del d["first_talk"]
        return d


def _check_text(value: Any, name: str, problems: list[str]) -> None:
    if not isinstance(value, str):
        problems.append(f"field '{name}': expected a string, got {type(value).__name__}")
    elif not value.strip():
        problems.append(f"field '{name}': must not be empty")


def parse_profile(record: Any, *, where: str = "<record>") -> Profile:
    """Validates one decoded JSON record and returns a Profile.

    Raises ProfileError listing every problem, each prefixed by `where` (e.g. "file.jsonl:12").
    """
    if not isinstance(record, Mapping):
        raise ProfileError(f"{where}: expected a JSON object, got {type(record).__name__}")
    problems: list[str] = []
    allowed = REQUIRED_FIELDS + OPTIONAL_FIELDS
    for name in REQUIRED_FIELDS:
        if name not in record:
            problems.append(f"field '{name}': missing; every profile needs "
                            + ", ".join(REQUIRED_FIELDS))
    for name in sorted(set(record) - set(allowed) - set(IGNORED_FIELDS)):
        problems.append(f"field '{name}': unknown field; allowed: {', '.join(allowed)} "
                        f"(and, ignored, {', '.join(IGNORED_FIELDS)})")
    for name in ("id", "player", "scene", "main_cha", "task"):
        if name in record:
            _check_text(record[name], name, problems)
    main_cha = record.get("main_cha")
    if isinstance(main_cha, str) and main_cha.strip() and (
            main_cha.strip().lower() not in PERSONALITIES):
        problems.append(f"field 'main_cha': {main_cha!r} is not a personality type; use one of "
                        + ", ".join(PERSONALITIES))
    traits = record.get("cha_group", [])
    if not (isinstance(traits, list) and all(isinstance(t, str) and t.strip() for t in traits)):
        problems.append("field 'cha_group': expected a list of non-empty strings")
    first_talk = record.get("first_talk")
    if first_talk is not None and not (isinstance(first_talk, str) and first_talk.strip()):
        problems.append("field 'first_talk': expected a non-empty string, or leave the field out")
    if problems:
        raise ProfileError("\n".join(f"{where}: {p}" for p in problems))
    return Profile(id=record["id"], player=record["player"], scene=record["scene"],
                   main_cha=main_cha, cha_group=tuple(traits), task=record["task"],
                   first_talk=first_talk)


def load_profiles(path: str | os.PathLike[str] | None = None) -> list[Profile]:
    """Reads a JSON Lines profile file (default: the project's shipped set).

    Lines are split on "\\n" only (U+2028, U+2029 and U+0085 are text inside a JSON string) and
    decoded as UTF-8 one by one (a byte-order mark at the start is dropped). Blank lines are
    skipped. Raises ProfileError naming file, line and field of every problem, including bytes
    that are not UTF-8 and duplicate ids; a missing file, a directory or an empty file is one
    problem naming the path.
    """
    path = pathlib.Path(path) if path is not None else DEFAULT_PROFILES
    try:
        lines = raw_lines(path)
    except FileNotFoundError:
        raise ProfileError(f"{path}: profile file not found") from None
    except IsADirectoryError:
        raise ProfileError(f"{path}: is a directory; give a JSON Lines profile file (one profile per line)") from None
    except OSError as e:
        raise ProfileError(f"{path}: cannot read the profile file ({e.strerror or e})") from None
    if lines[0].startswith(b"\xef\xbb\xbf"):
        lines[0] = lines[0][3:]
    profiles: list[Profile] = []
    problems: list[str] = []
    first_line_of: dict[str, int] = {}
    ignored: set[str] = set()
    for number, raw in enumerate(lines, start=1):
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            problems.append(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the "
                            "line); save the file as UTF-8")
            continue
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"{where}: not valid JSON ({e.msg} at column {e.colno})")
            continue
        try:
            profile = parse_profile(record, where=where)
        except ProfileError as e:
            problems.append(str(e))
            continue
        ignored.update(set(record) & set(IGNORED_FIELDS))
        if profile.id in first_line_of:
            problems.append(
                f"{where}: field 'id': duplicate id {profile.id!r} (first on line "
                f"{first_line_of[profile.id]}); ids must be unique"
            )
            continue
        first_line_of[profile.id] = number
        profiles.append(profile)
    if problems:
        raise _file_error(path, problems)
    if not profiles:
        raise ProfileError(f"{path}: no profiles in file")
    if ignored:
        log.warning("%s: ignoring the profile fields %s (SAGE's profile builder writes them; nothing here "
                    "reads them)", path, sorted(ignored))
    return profiles

"""SAGE's released benchmark results (../shared/data/sage/README.md) as judged replies.

A result file holds one JSON object per dialogue (`.jsonl`, or xz-compressed `.jsonl.xz`): `id`
(the profile's id in RLVER's test_profile.jsonl) and `history`, the whole dialogue, whose user
messages carry the simulator's `emotion-point` after the reply before them (the first one: the
initial emotion). Every assistant reply followed by such a user message is a judged reply: its
change is the difference of the two emotion points (the emotion machine's applied change, capped
at the ceiling as the simulator's was); the reply of SAGE's last round, never judged, is not one.
"""

from __future__ import annotations

import dataclasses
import json
import lzma
import os
import pathlib
from collections.abc import Iterator

SUFFIXES = (".jsonl", ".jsonl.xz")


@dataclasses.dataclass(frozen=True)
class JudgedReply:
    """One reply of a SAGE dialogue and the simulator's judgement of it."""

    dialogue: str  # the profile's id
    turn: int  # the reply's policy turn, 1-based
    history: tuple[dict[str, str], ...]  # the dialogue before the reply ({"role", "content"})
    emotions: tuple[int, ...]  # the emotion trajectory before the reply, the initial emotion first
    reply: str
    change: int  # the emotion after the reply minus the emotion before it


def stem(path: str | os.PathLike[str]) -> str:
    """A result file's name without `.jsonl` or `.jsonl.xz`: the model's key in reports."""
    name = pathlib.Path(path).name
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def _lines(path: pathlib.Path) -> Iterator[str]:
    if not path.name.endswith(SUFFIXES):
        raise ValueError(f"{path}: a SAGE result file ends with .jsonl or .jsonl.xz")
    try:
        opener = lzma.open if path.name.endswith(".xz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            yield from f
    except lzma.LZMAError as e:
        raise ValueError(f"{path}: not an xz file ({e})") from None


def _judged(dialogue: str, history: list[dict], where: str) -> list[JudgedReply]:
    """The judged replies of one dialogue's `history`."""
    out, before, emotions = [], [], []
    for i, message in enumerate(history):
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant") or not isinstance(content, str):
            raise ValueError(f"{where}: history[{i}] needs role 'user' or 'assistant' and a text content")
        if role == "user":
            point = message.get("emotion-point")
            if not isinstance(point, int):
                raise ValueError(f"{where}: history[{i}] (a user message) has no integer 'emotion-point'")
            if emotions and before[-1]["role"] == "assistant":
                out.append(JudgedReply(dialogue, len(out) + 1, tuple(before[:-1]), tuple(emotions),
                                       before[-1]["content"], point - emotions[-1]))
            emotions.append(point)
        before.append({"role": role, "content": content})
    return out


def read_results(path: str | os.PathLike[str]) -> list[JudgedReply]:
    """Every judged reply of a SAGE result file, dialogue by dialogue; a ValueError names the
    file and line of the first malformed one."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such SAGE result file")
    out: list[JudgedReply] = []
    for number, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(record, dict) or not isinstance(record.get("id"), str) or not isinstance(
                record.get("history"), list):
            raise ValueError(f"{where}: a SAGE result line is an object with a string 'id' and a list 'history'")
        out.extend(_judged(record["id"], record["history"], where))
    return out

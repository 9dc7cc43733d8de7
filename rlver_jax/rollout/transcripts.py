"""Transcripts: every batch's dialogues as JSON Lines, for inspection.

One file per step and kind, `{prefix}_{step:06d}.jsonl`, written atomically: a rerun of a step
replaces its file, and a run resuming at step S first removes the files of steps >= S (written
after the checkpoint it resumes from), so each step's dialogues are there exactly once.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Sequence

from rlver_jax.files import atomic_write_jsonl
from rlver_jax.rollout.sequence import DialogueSequence

_NAME = re.compile(r"(?:train|eval)_(\d{6,})\.jsonl")


def write_transcripts(directory: str | os.PathLike, step: int, sequences: Sequence[DialogueSequence],
                      prefix: str = "train", advantages: Sequence[float | None] | None = None) -> pathlib.Path:
    """`directory/{prefix}_{step:06d}.jsonl`: one dialogue per line (turns, thinking, replies,
    user utterances, emotions, changes, simulator thoughts, flags, the rewards its source gave it,
    rollout.rewards, and with `advantages` the advantage the trainer gave it: None for a dialogue
    left out of training)."""
    records = [{**s.to_record(), "step": step} for s in sequences]
    if advantages is not None:
        records = [{**r, "advantage": a} for r, a in zip(records, advantages, strict=True)]
    return atomic_write_jsonl(transcript_path(directory, step, prefix), records)


def transcript_path(directory: str | os.PathLike, step: int, prefix: str = "train") -> pathlib.Path:
    return pathlib.Path(directory) / f"{prefix}_{step:06d}.jsonl"


def discard_from(directory: str | os.PathLike, start: int) -> list[pathlib.Path]:
    """Remove the train and eval transcripts of steps >= `start`; returns what was removed."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for path in sorted(directory.iterdir()):
        match = _NAME.fullmatch(path.name)
        if match and int(match[1]) >= start:
            path.unlink()
            removed.append(path)
    return removed

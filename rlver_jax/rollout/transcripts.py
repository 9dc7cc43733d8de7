"""Transcripts: every batch's dialogues as JSON Lines, for inspection."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

from rlver_jax.files import atomic_write_jsonl
from rlver_jax.rollout.sequence import DialogueSequence


def write_transcripts(directory: str | os.PathLike, step: int,
                      sequences: Sequence[DialogueSequence], prefix: str = "train") -> pathlib.Path:
    """`directory/{prefix}_{step:06d}.jsonl`: one dialogue per line (turns, thinking, replies,
    user utterances, emotions, changes, simulator thoughts, flags, the reward)."""
    records = [{**s.to_record(), "reward": s.reward, "step": step} for s in sequences]
    return atomic_write_jsonl(pathlib.Path(directory) / f"{prefix}_{step:06d}.jsonl", records)

"""A run's checkpoints as files, read without orbax or JAX: the complete steps (orbax renames a
step's folder to its number only once the step is fully written) and each step's JSON record
(rlver_jax.train.resume writes it). launch/train.py reads them before it imports JAX
(rlver_jax.train.finished); rlver_jax.train.checkpoint writes and restores the arrays."""

from __future__ import annotations

import json
import os
from typing import Any

from etils import epath

from rlver_jax.train.workdir import is_url


def saved_steps(directory: str | os.PathLike) -> list[int]:
    """The complete checkpoints' steps in `directory` (a run's WORKDIR/checkpoints, a local path),
    from the folder names, without opening a manager."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def steps_in(directory: str | os.PathLike) -> list[int]:
    """The complete checkpoints' steps in `directory` (a path or a gs:// URL), from the folder names."""
    if is_url(directory):
        root = epath.Path(os.fspath(directory))
        return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.exists() else []
    return saved_steps(directory)


def read_record(directory: str | os.PathLike, step: int) -> dict[str, Any]:
    """The JSON record (`meta`) of checkpoint `step` in `directory`, read from its file without a
    manager (and without touching the arrays)."""
    root = epath.Path(os.fspath(directory)) if is_url(directory) else epath.Path(os.path.abspath(directory))
    record = json.loads((root / str(step) / "meta" / "metadata").read_text())
    if not isinstance(record, dict):
        raise ValueError(f"{root / str(step)}: the record is not a JSON object")
    return record


def newest_record(directory: str | os.PathLike) -> tuple[int, dict[str, Any]] | None:
    """(step, record) of the newest checkpoint in `directory` whose record reads; None when there is none."""
    for step in reversed(steps_in(directory)):
        try:
            return step, read_record(directory, step)
        except (OSError, ValueError):
            continue
    return None

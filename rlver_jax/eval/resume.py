"""Resumable result files: records appended one by one as they finish, and a guard against
mixing the results of two different set-ups in one directory."""

from __future__ import annotations

import json
import pathlib
from typing import Any

from rlver_jax.checks import InputError
from rlver_jax.files import atomic_write_jsonl, atomic_write_text, is_torn, read_jsonl


def load_records(path: pathlib.Path) -> list[dict[str, Any]]:
    """The records already in a JSON Lines results file (none when it does not exist).

    A last line torn by a crash is dropped and the file rewritten without it, so that the next
    append starts on a line of its own.
    """
    if not path.exists():
        return []
    records = read_jsonl(path)
    if is_torn(path):
        atomic_write_jsonl(path, records)
    return records


def check_setup(path: pathlib.Path, setup: dict[str, Any], results: pathlib.Path) -> None:
    """Record `setup` (what defines the results) in `path`; while `results` holds records, check
    that it equals the recorded one instead: a resumed run must not mix results of two set-ups."""
    setup_conflict(path, setup, results)
    record_setup(path, setup)


def setup_conflict(path: pathlib.Path, setup: dict[str, Any], results: pathlib.Path) -> None:
    """Raise InputError when `results` holds records of a set-up (recorded in `path`) other than `setup`."""
    setup = json.loads(json.dumps(setup))  # as it reads back from JSON
    if path.exists() and load_records(results):
        before = json.loads(path.read_text(encoding="utf-8"))
        changed = sorted(k for k in before.keys() | setup.keys() if before.get(k) != setup.get(k))
        if changed:
            detail = "; ".join(f"{k}: {before.get(k)!r} -> {setup.get(k)!r}" for k in changed)
            raise InputError(
                f"{path.parent} holds results of a different set-up ({detail}). Use a new work "
                f"directory, or delete {results} and {path} to start over")


def record_setup(path: pathlib.Path, setup: dict[str, Any]) -> None:
    """Write `setup` to `path` (atomically)."""
    atomic_write_text(path, json.dumps(setup, indent=2, ensure_ascii=False) + "\n")

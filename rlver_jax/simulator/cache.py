"""Record and replay of simulator requests: an on-disk map from the full request to the answer.

Keyed by the SHA-256 of the canonical JSON of the request (model, messages, sampling settings,
and the sample index, so a retried malformed answer has its own entry). One JSON file per entry,
written atomically (temporary file + rename), so a crash never leaves a half-written answer and
concurrent writers of the same entry are harmless. A re-run with the same cache reproduces the
simulator's answers bit for bit without the server; a crashed run does not pay twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from rlver_jax.files import atomic_write_text
from rlver_jax.simulator.interface import SimulatorUnavailableError


class CacheMissError(SimulatorUnavailableError):
    """Replay-only mode and no recorded answer for a request."""


class RequestCache:
    """A directory of recorded answers (created on first write)."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.directory = pathlib.Path(directory)

    @staticmethod
    def key(request: Mapping[str, Any]) -> str:
        canonical = json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def _path(self, key: str) -> pathlib.Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, request: Mapping[str, Any]) -> str | None:
        """The recorded answer to `request`, or None."""
        try:
            entry = json.loads(self._path(self.key(request)).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        return entry["content"]

    def put(self, request: Mapping[str, Any], content: str) -> None:
        """Records the answer; the request is stored beside it for inspection."""
        atomic_write_text(self._path(self.key(request)),
                          json.dumps({"request": request, "content": content}, ensure_ascii=False))

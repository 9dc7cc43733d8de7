"""The parameter versions an engine holds, shared between the trainer's thread that publishes them
and the engine's turns that wait for the version they want (rollout.versions.VersionSchedule says
which one each turn wants)."""

from __future__ import annotations

import threading
from typing import Any


class RolloutClosed(RuntimeError):
    """The rollout closed while a turn waited for its parameter version."""


class Published:
    """The parameter versions a sampler holds (version -> what it samples with), shared between
    the trainer's thread that publishes them and the sampler's turns that wait for them."""

    def __init__(self):
        self._cond = threading.Condition()
        self._versions: dict[int, Any] = {}
        self._closed = False

    def put(self, version: int, params: Any) -> None:
        with self._cond:
            self._versions[version] = params
            self._cond.notify_all()

    def resolve(self, wanted: int) -> tuple[int, Any]:
        """(version, parameters) a turn wanting version `wanted` samples with: once the newest
        published version is >= `wanted`, the smallest published one >= `wanted` (`wanted` itself,
        but for versions never published: those before a run's first, or a resume's checkpoint
        lacks). Blocks the calling thread until then; raises RolloutClosed once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or (self._versions and max(self._versions) >= wanted))
            if self._closed:
                raise RolloutClosed(f"the rollout closed while a turn waited for version {wanted}")
            version = min(v for v in self._versions if v >= wanted)
            return version, self._versions[version]

    def retire_below(self, version: int) -> None:
        """Drop the versions below `version` (no turn to come wants them)."""
        with self._cond:
            for old in [v for v in self._versions if v < version]:
                del self._versions[old]

    def close(self) -> None:
        """Wake every waiting turn with RolloutClosed; later ones raise at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

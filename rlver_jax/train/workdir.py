"""A run's work directory: a local path, or a bucket URL such as gs://bucket/run (Cloud TPU pods).

Orbax writes checkpoints straight to the URL (`checkpoints`, every process its shards). Everything
else a run writes (config.json, metrics.jsonl, TensorBoard events, transcripts, reward.png, the tiny
tokenizer, W&B files) goes to `local`: the directory itself, or for a URL a local staging directory
that process 0 mirrors to the URL after every step (`push`: files new or changed since the last
push, each uploaded whole, which an object store writes atomically). A resumed run first fetches the
metrics written so far (`pull`), so its metrics.jsonl and reward.png cover the whole run.

URLs go through etils.epath (fsspec): gs:// needs `pip install gcsfs` (and `google-cloud-storage`
for TensorBoard's own writer, which is not used: events are mirrored like every other file).
"""

from __future__ import annotations

import logging
import os
import pathlib
import tempfile

from etils import epath

log = logging.getLogger(__name__)


def is_url(path: str | os.PathLike) -> bool:
    """Whether `path` names a remote location (scheme://...) rather than a local path."""
    return "://" in os.fspath(path)


class WorkDir:
    """The work directory `config.workdir` (see the module docstring)."""

    def __init__(self, location: str | os.PathLike):
        location = os.fspath(location)
        if not location:
            raise ValueError("config.workdir is empty: set --config.workdir=DIR (or gs://bucket/DIR)")
        self.location = location
        self.remote = epath.Path(location) if is_url(location) else None
        if self.remote is None:
            self.local = pathlib.Path(location)
        else:
            self.local = pathlib.Path(tempfile.mkdtemp(prefix="rlver_workdir_"))
            log.info("work directory %s, staged in %s", location, self.local)
        self.local.mkdir(parents=True, exist_ok=True)
        self._pushed: dict[pathlib.Path, tuple[int, int]] = {}

    @property
    def checkpoints(self) -> str:
        """Where orbax keeps the checkpoints: WORKDIR/checkpoints, local or remote."""
        return os.path.join(self.location, "checkpoints") if self.remote else str(self.local / "checkpoints")

    def pull(self, *names: str) -> None:
        """Fetch the files `names` (relative paths) that exist at the URL into the staging directory."""
        if self.remote is None:
            return
        for name in names:
            src = self.remote / name
            if src.exists():
                dst = self.local / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(src.read_bytes())
                self._pushed[dst] = _signature(dst)

    def push(self) -> None:
        """Upload every staged file that is new or changed since the last push (process 0 calls it)."""
        if self.remote is None:
            return
        for path in sorted(p for p in self.local.rglob("*") if p.is_file() and not p.name.startswith(".")):
            sig = _signature(path)
            if self._pushed.get(path) == sig:
                continue
            dst = self.remote / path.relative_to(self.local).as_posix()
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(path.read_bytes())
            self._pushed[path] = sig


def _signature(path: pathlib.Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns

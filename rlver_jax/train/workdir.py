"""A run's work directory: a local path, or a bucket URL such as gs://bucket/run (Cloud TPU pods).

Orbax writes checkpoints straight to the URL (`checkpoints`, every process its shards). Everything
else a run writes (config.json, metrics.jsonl, TensorBoard events, transcripts, reward.png, the tiny
tokenizer, W&B files) goes to `local`: the directory itself, or for a URL a local staging directory
that process 0 mirrors to the URL after every step (`push`: files new or changed since the last
push, each uploaded whole, which an object store writes atomically). A resumed run first fetches the
metrics written so far (`pull`), so its metrics.jsonl and reward.png cover the whole run.

URLs go through etils.epath (fsspec): gs:// needs `pip install gcsfs` (and `google-cloud-storage`
for TensorBoard's own writer, which is not used: events are mirrored like every other file).

One run at a time: `WorkDirLock` is the lock file WORKDIR/.lock that process 0 of a training run
or an evaluation holds while it runs (its host, pid, start time and what it runs); a second run is
refused in one line naming the holder. A lock whose process is gone (this host, pid not alive) is
taken over with a warning; one of another host cannot be checked and is refused with the holder
named (remove the file once that run is known to be gone). On a bucket the lock is written and read
back, not created atomically: two runs started within the same second may both pass.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import pathlib
import shutil
import socket
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from etils import epath

from rlver_jax.files import pid_alive

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
        # Whether this made the local directory (a staging directory always): `remove_if_new`.
        self.created = self.remote is not None or not self.local.exists()
        self.local.mkdir(parents=True, exist_ok=True)
        self._pushed: dict[pathlib.Path, tuple[int, int]] = {}

    def remove_if_new(self, written: Sequence[str] = ()) -> None:
        """After a start that failed before training: the local directory, if this made it, goes
        again with `written` (the entries the start wrote in it, removed only while it holds nothing
        else but the lock), so a failed start leaves no new directory behind; one holding anything
        else is kept, and so is one that was there before."""
        if not self.created or not self.local.is_dir():
            return
        entries = {e.name for e in self.local.iterdir()} - {LOCK}
        if written and entries <= set(written):
            for name in entries:
                path = self.local / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        try:
            self.local.rmdir()  # only an empty one (the lock, if still held, keeps it)
        except OSError:
            pass

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


LOCK = ".lock"


class WorkDirBusyError(RuntimeError):
    """Another run holds the work directory's lock."""


class WorkDirLock:
    """The lock file of a work directory (see the module docstring): `acquire` creates it or takes
    over a stale one, `release` removes it if it is still this process's."""

    def __init__(self, location: str | os.PathLike, what: str):
        self.location = os.fspath(location)
        self.path = (epath.Path(self.location) if is_url(self.location) else pathlib.Path(self.location)) / LOCK
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "what": what,
                      "started": datetime.datetime.now().isoformat(timespec="seconds"),
                      "command": " ".join(sys.argv)[:500]}
        self.held = False

    def acquire(self) -> WorkDirLock:
        text = json.dumps(self.owner) + "\n"
        for _ in range(3):  # a stale lock taken over, or one released meanwhile: try again
            if self._create(text):
                self.held = True
                return self
            holder = self._holder()
            if holder is None:  # gone between the two calls, or unreadable: written by a crash
                self._remove()
                continue
            if self._is_stale(holder):
                log.warning("%s: taking over the lock of %s (pid %s on %s, started %s), whose process is gone",
                            self.location, holder.get("what", "a run"), holder.get("pid"), holder.get("host"),
                            holder.get("started"))
                self._remove()
                continue
            where = "this host" if holder.get("host") == self.owner["host"] else f"host {holder.get('host')}"
            raise WorkDirBusyError(
                f"{self.location} is in use by {holder.get('what', 'another run')} (pid {holder.get('pid')} "
                f"on {where}, since {holder.get('started')}: {holder.get('command', '')}); wait for it to end or use "
                f"another work directory (if that process is gone, remove {self.path})")
        raise WorkDirBusyError(f"{self.path}: the lock could not be taken (it changed while it was being read)")

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        holder = self._holder()
        if holder is not None and holder.get("pid") == self.owner["pid"] and holder.get("host") == self.owner["host"]:
            self._remove()

    def __enter__(self) -> WorkDirLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _is_stale(self, holder: dict[str, Any]) -> bool:
        """Whether `holder` is gone: this host's process that is no longer alive, or this very
        process (a lock it left behind, e.g. a run built and never trained)."""
        if holder.get("host") != self.owner["host"] or not isinstance(holder.get("pid"), int):
            return False
        return holder["pid"] == os.getpid() or not pid_alive(holder["pid"])

    def _create(self, text: str) -> bool:
        if isinstance(self.path, pathlib.Path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return True
        if self.path.exists():
            return False
        self.path.write_text(text)
        return json.loads(self.path.read_text()).get("pid") == self.owner["pid"]

    def _holder(self) -> dict[str, Any] | None:
        try:
            holder = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return holder if isinstance(holder, dict) else None

    def _remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


# What a training run leaves in its work directory: a directory holding one of these holds a run.
RUN_FILES = ("checkpoints", "metrics.jsonl", "transcripts", "tensorboard")


def run_files(location: str | os.PathLike) -> list[str]:
    """Those of RUN_FILES that hold something in the work directory `location` (a path or URL)."""
    root = epath.Path(location) if is_url(location) else pathlib.Path(location)
    found = []
    for name in RUN_FILES:
        path = root / name
        if path.is_dir() and any(True for _ in path.iterdir()) or (path.is_file() and path.stat().st_size):
            found.append(name)
    return found


def move_aside(location: str | os.PathLike) -> pathlib.Path:
    """Move everything in the local work directory `location` but its lock into a new sibling
    directory LOCATION.previous-N (N: the first free number); returns it."""
    root = pathlib.Path(location)
    if is_url(location):
        raise ValueError(f"config.checkpoint.start_over=True with {location}: move the old run on the bucket "
                         "yourself (e.g. gsutil -m mv), then rerun")
    n = 1
    while (aside := root.with_name(f"{root.name}.previous-{n}")).exists():
        n += 1
    aside.mkdir()
    for entry in sorted(root.iterdir()):
        if entry.name != LOCK:
            shutil.move(str(entry), str(aside / entry.name))
    return aside

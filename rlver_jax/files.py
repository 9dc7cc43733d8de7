"""Atomic file and directory writes and JSON Lines: a crash never leaves a half-written transcript,
metrics or report file, or model directory, and any text a model produces survives the round trip.

JSON Lines are split on "\\n" only: JSON written with ensure_ascii=False keeps U+0085, U+2028 and
U+2029 raw inside strings, and str.splitlines() would split there. A lone surrogate (an unpaired
"\\ud800" in a server's JSON answer) cannot be encoded as UTF-8; every writer here escapes it as
`\\udXXX`, which is still valid JSON and reads back as the same string.

Modes: what these write gets the mode a plain open() or mkdir() would give under the process's
umask (0644 and 0755 under the usual 022), never a temporary file's private 0600 (mkstemp's, or
safetensors' save_file, which writes a temporary and renames it).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

# Encoding error handler of every text writer: lone surrogates become "\udXXX" (the only code
# points UTF-8 cannot encode); inside a JSON string that is the JSON escape of the same character.
_ESCAPE = "backslashreplace"


def umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status)."""
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (not atomic with other threads' file creation)
    os.umask(mask)
    return mask


def plain_mode(directory: bool = False, executable: bool = False) -> int:
    """The mode open() (0666, or 0777 for an executable) or mkdir() (0777) gives under the umask."""
    return (0o777 if directory or executable else 0o666) & ~umask()


def _share_tree(root: pathlib.Path) -> None:
    """`root` and everything under it (links aside) to plain_mode: writers' private temporaries
    renamed into place keep their 0600 otherwise. Executables (user x bit) stay executable."""
    os.chmod(root, plain_mode(directory=True))
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            p = os.path.join(folder, name)
            if os.path.islink(p):
                continue
            is_dir = os.path.isdir(p)
            os.chmod(p, plain_mode(directory=is_dir, executable=not is_dir and bool(os.stat(p).st_mode & 0o100)))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> pathlib.Path:
    """Write `data` to a temporary file beside `path`, then rename it into place."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, plain_mode())  # mkstemp creates 0600; outputs are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> pathlib.Path:
    """`atomic_write_bytes` of UTF-8 text (lone surrogates escaped, see the module docstring)."""
    return atomic_write_bytes(path, text.encode("utf-8", _ESCAPE))


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"


def _staging_prefix(path: pathlib.Path) -> str:
    """The start of the name of `path`'s staging directories: `.NAME.PID@HOST.` (then mkdtemp's
    random part and `.tmp`), so that a later run can tell whether its writer still lives."""
    return f".{path.name}.{os.getpid()}@{_host()}."


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host exists (another user's counts)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_staging(path: str | os.PathLike) -> list[pathlib.Path]:
    """Remove the staging directories of `path` that a killed writer left (hidden siblings
    `.NAME.PID@HOST.*.tmp` whose process on this host is gone; the same one level deeper, as a
    writer nested in another's staging directory makes them, and its `.old`; the untagged
    `.NAME.*.tmp` of older versions); another host's, or a live process's, are kept (a pid reused
    since keeps one until that process ends). Returns those removed."""
    path = pathlib.Path(path)
    rand = r"[a-z0-9_]{8}"  # mkdtemp's random part
    staged = re.compile(rf"\.+{re.escape(path.name)}\.(?:(\d+)@([A-Za-z0-9-]+)\.)?{rand}\.tmp"
                        rf"(?:\.(?:\d+@[A-Za-z0-9-]+\.)?{rand}\.tmp)?(?:\.old)?")
    removed = []
    try:
        siblings = list(path.parent.iterdir())
    except FileNotFoundError:
        return removed
    for sibling in siblings:
        m = staged.fullmatch(sibling.name)
        if not m or sibling.is_symlink() or not sibling.is_dir():
            continue
        pid, host = m.group(1), m.group(2)
        if pid is None or (host == _host() and not pid_alive(int(pid))):
            shutil.rmtree(sibling, ignore_errors=True)
            removed.append(sibling)
    return removed


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[pathlib.Path]:
    """Yield a temporary sibling directory of `path` to fill; on a clean exit it is renamed to
    `path` (an existing `path` is moved aside first and removed after), on an exception removed.
    So `path` holds the old directory or the complete new one, never a partial one. What a killed
    run left staged for `path` is removed first (`remove_stale_staging`); the finished directory
    and its files get plain_mode (`_share_tree`), whatever mode their writers gave them."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(path)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=path.parent, prefix=_staging_prefix(path), suffix=".tmp"))
    try:
        os.chmod(tmp, plain_mode(directory=True))  # mkdtemp creates 0700; outputs are meant to be shared
        yield tmp
        _share_tree(tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def json_line(record: dict[str, Any]) -> str:
    """One JSON Lines line of `record`, newline included."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def atomic_write_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> pathlib.Path:
    """Write one JSON object per line, atomically."""
    return atomic_write_text(path, "".join(json_line(r) for r in records))


def append_jsonl(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one JSON line and flush it (a crash loses at most the line being written)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8", errors=_ESCAPE) as f:
        f.write(json_line(record))
        f.flush()
        os.fsync(f.fileno())


def raw_lines(path: str | os.PathLike) -> list[bytes]:
    """The lines of a file as bytes, split on b"\\n" only (the last one is b"" when the file ends
    with a newline); a directory is an error that names it."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, not a file")
    return path.read_bytes().split(b"\n")


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read JSON lines, ignoring a torn last line left by a crash mid-append. Raises ValueError
    naming the file and line of any other line that is not UTF-8 or not JSON."""
    lines = raw_lines(path)
    out = []
    for i, raw in enumerate(lines):
        try:
            line = raw.decode("utf-8")
            if line.strip():
                out.append(json.loads(line))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if i == len(lines) - 1:  # no newline after it: cut short by a crash
                break
            what = "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else "not valid JSON"
            raise ValueError(f"{path}:{i + 1}: {what}") from None
    return out


def is_torn(path: str | os.PathLike) -> bool:
    """Whether a JSON Lines file ends without its newline (a crash cut its last line short)."""
    path = pathlib.Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return False
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"

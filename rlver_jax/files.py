"""Atomic file and directory writes and JSON Lines: a crash never leaves a half-written transcript,
metrics or report file, or model directory, and any text a model produces survives the round trip.

JSON Lines are split on "\\n" only: JSON written with ensure_ascii=False keeps U+0085, U+2028 and
U+2029 raw inside strings, and str.splitlines() would split there. A lone surrogate (an unpaired
"\\ud800" in a server's JSON answer) cannot be encoded as UTF-8; every writer here escapes it as
`\\udXXX`, which is still valid JSON and reads back as the same string.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

# Encoding error handler of every text writer: lone surrogates become "\udXXX" (the only code
# points UTF-8 cannot encode); inside a JSON string that is the JSON escape of the same character.
_ESCAPE = "backslashreplace"


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
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> pathlib.Path:
    """`atomic_write_bytes` of UTF-8 text (lone surrogates escaped, see the module docstring)."""
    return atomic_write_bytes(path, text.encode("utf-8", _ESCAPE))


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[pathlib.Path]:
    """Yield a temporary sibling directory of `path` to fill; on a clean exit it is renamed to
    `path` (an existing `path` is moved aside first and removed after), on an exception removed.
    So `path` holds the old directory or the complete new one, never a partial one."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700; outputs are meant to be shared
        yield tmp
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

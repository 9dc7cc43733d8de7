"""JSON Lines and atomic writes with any text a model produces: Unicode line separators, NEL,
lone surrogates, NUL; torn last lines, bytes that are not UTF-8, directories; atomic directories
that fail midway."""

import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from rlver_jax import files
from rlver_jax.eval.resume import load_records
from rlver_jax.files import append_jsonl, atomic_directory, atomic_write_jsonl, atomic_write_text, is_torn, read_jsonl
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.rollout.transcripts import write_transcripts
from tests.conftest import REPO

# Each breaks a naive reader: splitlines() splits at the first three, UTF-8 cannot encode the
# lone surrogate, and NUL ends C strings.
AWKWARD = ["line\u2028separator", "para\u2029graph", "next\u0085line", "lone \ud800 surrogate",
           "nul\x00byte", "你好 😀 \r\n crlf"]


def _records():
    return [{"i": i, "text": t, t: "as a key"} for i, t in enumerate(AWKWARD)]


def test_appended_and_atomic_lines_read_back_exactly(tmp_path):
    appended, atomic = tmp_path / "appended.jsonl", tmp_path / "atomic.jsonl"
    for r in _records():
        append_jsonl(appended, r)
    atomic_write_jsonl(atomic, _records())
    for path in (appended, atomic):
        assert read_jsonl(path) == _records()
        data = path.read_bytes()
        assert data.count(b"\n") == len(AWKWARD)  # one line per record: "\n" only ends a line
        assert b"\\ud800" in data  # the lone surrogate as its JSON escape; the file is valid UTF-8
        data.decode("utf-8")
        assert [json.loads(line)["i"] for line in data.decode("utf-8").split("\n") if line] == list(range(6))
        assert not is_torn(path)


def test_a_text_file_with_a_lone_surrogate_is_written(tmp_path):
    path = atomic_write_text(tmp_path / "report.md", "score \ud83d of 5\n")
    assert path.read_text(encoding="utf-8") == "score \\ud83d of 5\n"


def test_transcripts_of_awkward_dialogues_read_back_as_the_same_dialogues(tmp_path):
    turns = [{"turn": 1, "raw": t, "reply": t, "user": t} for t in AWKWARD]
    seq = DialogueSequence(profile_id="p\u2028", group=0, tokens=[1], policy_mask=[1], logprobs=[0.0],
                           turn_ends=[0], emotions=[40.0, 50.0], end_reason="turn_limit", turns=turns,
                           messages=[{"role": "assistant", "content": t} for t in AWKWARD])
    path = write_transcripts(tmp_path, 3, [seq, seq])
    [a, b] = read_jsonl(path)
    assert a == b and a["step"] == 3
    back = DialogueSequence.from_record(a)
    assert back.turns == turns and back.messages == seq.messages and back.profile_id == "p\u2028"


def test_a_torn_last_line_is_ignored_and_load_records_repairs_it(tmp_path):
    path = tmp_path / "transcripts.jsonl"
    atomic_write_jsonl(path, _records()[:2])
    torn = json.dumps({"text": "你好"}, ensure_ascii=False).encode("utf-8")
    with open(path, "ab") as f:
        f.write(torn[:-5])  # cut inside the multi-byte "好": not even UTF-8
    assert is_torn(path)
    assert read_jsonl(path) == _records()[:2]
    assert load_records(path) == _records()[:2]  # and rewritten without the torn line
    assert not is_torn(path) and read_jsonl(path) == _records()[:2]
    append_jsonl(path, {"next": 1})
    assert read_jsonl(path)[-1] == {"next": 1}


def test_bad_lines_and_directories_are_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 0}\n{"step": 1, "x\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        read_jsonl(path)
    path.write_bytes(b'{"step": 0}\n{"text": "\xff\xfe"}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not UTF-8 text"):
        read_jsonl(path)
    with pytest.raises(IsADirectoryError, match=f"{tmp_path} is a directory"):
        read_jsonl(tmp_path)
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert read_jsonl(tmp_path / "empty.jsonl") == [] and not is_torn(tmp_path / "empty.jsonl")


def _tree(path):
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


def test_an_atomic_directory_appears_complete_or_not_at_all(tmp_path):
    out = tmp_path / "model"
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_directory(out) as stage:
            (stage / "config.json").write_text("{}")
            raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []  # neither `out` nor a partial sibling
    with atomic_directory(out) as stage:
        assert stage.parent == tmp_path and stage != out and not out.exists()
        (stage / "sub").mkdir()
        (stage / "sub" / "a.txt").write_text("first")
    assert _tree(out) == {"sub/a.txt": "first"}
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_failed_rewrite_keeps_the_old_directory_and_a_finished_one_replaces_it(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "weights").write_text("old")
    (out / "stale").write_text("old only")
    with pytest.raises(KeyboardInterrupt):
        with atomic_directory(out) as stage:
            (stage / "weights").write_text("new, half")
            raise KeyboardInterrupt  # not only Exceptions: an interrupt midway too
    assert _tree(out) == {"weights": "old", "stale": "old only"}
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    with atomic_directory(out) as stage:
        (stage / "weights").write_text("new")
    assert _tree(out) == {"weights": "new"}  # replaced, not merged
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # the old one moved aside is gone


@pytest.fixture
def set_umask():
    """Set the process umask for one test, restored after."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield os.umask
    os.umask(saved)


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_written_files_get_the_plain_mode_under_the_umask(tmp_path, set_umask, mask):
    set_umask(mask)
    assert atomic_write_text(tmp_path / "a.txt", "x").stat().st_mode & 0o777 == 0o666 & ~mask
    out = tmp_path / "model"
    with atomic_directory(out) as stage:
        fd, private = tempfile.mkstemp(dir=stage)  # 0600, as safetensors' save_file leaves its file
        os.close(fd)
        os.replace(private, stage / "model.safetensors")
        (stage / "config.json").write_text("{}")
        (stage / "sub").mkdir(mode=0o700)
        (stage / "sub" / "run.sh").write_text("#!/bin/sh\n")
        os.chmod(stage / "sub" / "run.sh", 0o700)
    modes = {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777 for p in [out, *out.rglob("*")]}
    assert modes == {"model": 0o777 & ~mask, "model/model.safetensors": 0o666 & ~mask,
                     "model/config.json": 0o666 & ~mask, "model/sub": 0o777 & ~mask,
                     "model/sub/run.sh": 0o777 & ~mask}


_KILLED_WRITER = """
import os, signal, sys
from rlver_jax.files import atomic_directory
with atomic_directory(sys.argv[1]) as stage:
    with atomic_directory(stage) as inner:  # as an export's save_pretrained writes into its stage
        (inner / "model.safetensors").write_text("half")
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_new_write_removes_what_a_killed_one_left_staged(tmp_path):
    out = tmp_path / "model"
    left = []
    for _ in range(2):  # two killed exports: the second removes the first's staging
        done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(out)], cwd=REPO, timeout=60)
        assert done.returncode == -signal.SIGKILL
        now = sorted(p.name for p in tmp_path.iterdir())
        assert len(now) == 2 and now[0].startswith("..model.") and now[1].startswith(".model.") and now != left, now
        left = now
    # Kept: a live process's staging, another host's, an older version's of another name; removed:
    # the killed ones and an untagged one of an older version.
    kept = [f".model.{os.getppid()}@{files._host()}.abcdefgh.tmp", ".model.1@elsewhere.abcdefgh.tmp",
            ".model.v2.abcdefgh.tmp"]
    for name in kept + [".model.abcdefgh.tmp"]:
        (tmp_path / name).mkdir()
    with atomic_directory(out) as stage:
        (stage / "model.safetensors").write_text("whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept + ["model"])
    assert _tree(out) == {"model.safetensors": "whole"}

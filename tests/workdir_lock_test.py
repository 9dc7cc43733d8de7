"""One run per work directory (issue 44): the lock a training run or an evaluation holds, refusing a
second one in one line, taking over the lock of a process that is gone; what counts as a run in a
directory, and moving one aside. Training's and the benchmark's refusals come before anything is
written (the claims of training: resume_test.py)."""

import json
import os
import socket
import subprocess
import sys

import pytest

from rlver_jax.eval.benchmark import run_benchmark
from rlver_jax.eval.spec import EvalSpec
from rlver_jax.train.workdir import LOCK, WorkDirBusyError, WorkDirLock, move_aside, run_files
from tests.fixtures_eval import config_urls, profiles_file


@pytest.fixture
def other_process():
    """A live process of this host other than this one: the holder of a lock."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def hold(directory, pid, host=None, what="training"):
    """A lock file as `pid` on `host` (default: this host) would have written it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / LOCK).write_text(json.dumps({"host": host or socket.gethostname(), "pid": pid, "what": what,
                                              "started": "2026-12-04T10:00:00", "command": "launch/train.py ..."}))


def test_a_second_run_is_refused_in_one_line_naming_the_holder(tmp_path, other_process):
    hold(tmp_path, other_process)
    with pytest.raises(WorkDirBusyError) as error:
        WorkDirLock(tmp_path, "training").acquire()
    message = str(error.value)
    assert "\n" not in message and message.startswith(
        f"{tmp_path} is in use by training (pid {other_process} on this host, since 2026-12-04T10:00:00")
    assert f"if that process is gone, remove {tmp_path / LOCK}" in message
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == other_process  # not touched


def test_the_lock_is_held_while_running_and_removed_after(tmp_path):
    with WorkDirLock(tmp_path / "run", "training") as lock:
        held = json.loads((tmp_path / "run" / LOCK).read_text())
        assert (held["pid"], held["host"], held["what"]) == (os.getpid(), socket.gethostname(), "training")
        assert lock.held
    assert not (tmp_path / "run" / LOCK).exists()


def test_a_stale_lock_is_taken_over_another_hosts_is_not(tmp_path, caplog):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    hold(tmp_path, int(dead))
    with WorkDirLock(tmp_path, "an evaluation"):
        assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    assert "taking over the lock" in caplog.text and f"pid {dead}" in caplog.text
    hold(tmp_path, os.getpid())  # this very process left it (a run built, never trained): its own
    WorkDirLock(tmp_path, "training").acquire().release()
    hold(tmp_path, 1, host="another-host")  # its liveness cannot be checked from here
    with pytest.raises(WorkDirBusyError, match="pid 1 on host another-host"):
        WorkDirLock(tmp_path, "training").acquire()


def test_what_counts_as_a_run_and_moving_one_aside(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")  # a run that failed before its first step
    (run / "tokenizer").mkdir()
    assert run_files(run) == []
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / "checkpoints" / "2").mkdir(parents=True)
    (run / "transcripts").mkdir()  # empty
    assert run_files(run) == ["checkpoints", "metrics.jsonl"]
    hold(run, os.getpid())
    aside = move_aside(run)
    assert aside == tmp_path / "run.previous-1"
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoints", "config.json", "metrics.jsonl", "tokenizer",
                                                       "transcripts"]
    assert [p.name for p in run.iterdir()] == [LOCK] and run_files(run) == []
    assert move_aside(run) == tmp_path / "run.previous-2"


def test_a_second_evaluation_in_a_directory_is_refused_before_it_plays(tmp_path, other_process):
    """Two evaluations at once played every profile twice; the second is refused, nothing written."""
    config = config_urls(tmp_path / "eval", "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1",
                          profiles_file(tmp_path, ("P1",)))
    hold(tmp_path / "eval", other_process, what="an evaluation")
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'eval'} is in use by an evaluation \(pid {other_process}"):
        run_benchmark(EvalSpec.from_config(config), progress=False)
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == [LOCK]

"""Faults through the real entry points (launch/train.py and launch/eval.py): bad inputs, a full disk,
a second trainer on a work directory and a preemption's SIGTERM end with one line, the right exit
status and no traceback. The one-line errors run the script's main in this process
(tests/fixtures_cli.run_script); SIGTERM, which needs a process of its own to signal, runs a
subprocess. (Ctrl-C: tests/interrupts_test.py; SIGTERM mid-update and resume: training_test.py.)"""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rlver_jax import files
from rlver_jax.eval.benchmark import run_benchmark
from rlver_jax.eval.spec import EvalSpec
from rlver_jax.files import read_jsonl
from rlver_jax.simulator.profiles import DEFAULT_PROFILES
from rlver_jax.testing.scripted_server import Reply, ScriptedServer, route
from tests.conftest import REPO
from tests.fixtures_cli import run_script
from tests.fixtures_eval import config_urls, profiles_file

# The tiny GRPO preset cut down to the least that trains (tests/training_test.py `small`).
SMALL = ["--config=configs/grpo_think.py:tiny", "--config.rollout.profiles_per_step=2",
         "--config.rollout.max_new_tokens=8", "--config.simulator.max_turns=2", "--config.rl.micro_batch_size=2",
         "--config.train.eval_every=0", "--config.data.eval_holdout=2", "--config.checkpoint.save_every=2",
         "--config.checkpoint.async_save=False"]

def _last_line(out):
    assert "Traceback" not in out.stderr, out.stderr
    return [line for line in out.stderr.splitlines() if line.strip()][-1]


def _profiles(tmp_path, data: bytes):
    path = tmp_path / "profiles.jsonl"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", ["directory", "not_utf8", "ranges", "full_disk"])
def test_train_stops_on_bad_input_or_a_full_disk_with_one_line(tmp_path, case, monkeypatch):
    workdir = tmp_path / "run"
    good = DEFAULT_PROFILES.read_bytes()
    flags = [*SMALL, f"--config.workdir={workdir}"]
    status = 2  # bad input, whether the spec finds it before JAX is imported or the run while loading; 1: the disk
    if case == "directory":
        out, expected = run_script("train.py", *flags, f"--config.data.train_profiles={tmp_path}"), (
            f"train.py: error: config.data.train_profiles='{tmp_path}' is a directory: give a JSON Lines profile file")
        status = 2
    elif case == "not_utf8":
        path = _profiles(tmp_path, good.replace(b"\n", b"\n\xff", 1))
        out, expected = run_script("train.py", *flags, f"--config.data.train_profiles={path}"), (
            f"train.py: error: {path}:2: not UTF-8 text (byte 0xff at byte 1 of the line)")
    elif case == "ranges":
        out = run_script("train.py", *flags, "--config.train.steps=-1", "--config.rollout.temperature=-1.0")
        expected = "train.py: error: config.train.steps=-1 must be >= 0; config.rollout.temperature=-1.0 must be >= 0"
        status = 2
    else:  # the disk is full for every file written under a tokenizer/ folder (the tiny preset
        # builds its tokenizer into the work directory before anything else)
        write = files.atomic_write_bytes

        def full(path, data):
            if "tokenizer" in str(path):
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            return write(path, data)

        monkeypatch.setattr(files, "atomic_write_bytes", full)
        out, expected = run_script("train.py", *flags), "train.py: error: [Errno 28] No space left on device: "
        status = 1
    assert out.returncode == status
    assert _last_line(out).startswith(expected), out.stderr
    if case == "full_disk":
        assert "tokenizer" in _last_line(out) and "rerun the same command to resume" in _last_line(out)


def test_eval_rejects_out_of_range_settings_with_one_line(tmp_path):
    out = run_script("eval.py", "--config=configs/eval.py:tiny", f"--config.workdir={tmp_path}",
                     "--config.eval.group_size=0", "--config.simulator.max_concurrency=0",
                     "--config.simulator.backend=openai")  # the embedded simulator reads no max_concurrency
    assert out.returncode == 2  # a config error, before JAX is imported
    assert _last_line(out) == ("eval.py: error: config.eval.group_size=0 must be >= 1; "
                               "config.simulator.max_concurrency=0 must be >= 1")


@pytest.mark.slow
def test_sigterm_saves_the_last_complete_step_and_exits_143_a_second_trainer_is_refused(tmp_path):
    """A preemption's SIGTERM once step 0's metrics line is written (in step 0's checkpoint, or step
    1's rollout or update): that step is finished and saved, one line, exit 143 (it used to kill the
    run with nothing saved). While it runs, a second trainer on its directory is refused in one line."""
    workdir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "launch/train.py", *SMALL, f"--config.workdir={workdir}",
                             "--config.train.steps=4"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        metrics = workdir / "metrics.jsonl"
        while not (workdir / ".lock").exists() and proc.poll() is None:
            time.sleep(0.1)
        second = run_script("train.py", *SMALL, f"--config.workdir={workdir}", "--config.train.steps=4")
        while not (metrics.exists() and metrics.read_text()) and proc.poll() is None:
            assert time.monotonic() < deadline, "no step finished in time"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert second.returncode == 1 and _last_line(second).startswith(
        f"train.py: error: {workdir} is in use by training (pid {proc.pid} on this host"), second.stderr
    out = subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)
    assert proc.returncode == 143, stderr
    line = _last_line(out)
    steps = [json.loads(row)["step"] for row in metrics.read_text().split("\n") if row]
    saved = len(steps)  # every finished step is in the checkpoint, and only those
    assert line == (f"train.py: stopped by SIGTERM: the checkpoint of step {saved} is in {workdir / 'checkpoints'}. "
                    f"Rerun the same command to resume (config.workdir={workdir}).")
    assert steps == list(range(saved)) and saved in (1, 2) and not (workdir / ".lock").exists()


def test_eval_marks_the_dialogue_whose_prompt_the_simulator_refuses_and_goes_on(tmp_path):
    """A simulator answering HTTP 400 (a prompt beyond its context) for one profile's dialogue: that
    dialogue is a simulator error, recorded and counted; the others are scored."""
    def emotion(request):
        if "Name: P2" in request["messages"][0]["content"]:
            return Reply(status=400)
        return "Intent: comfort\nFit: fine\nInner reaction: ok\nFeeling: moved\nChange: +10"

    script = route(emotion=emotion, reply=lambda r: "Plan: go on\nResponse: Yeah... it has been a lot.")
    with ScriptedServer(lambda r: "I hear you.", model="policy") as policy, ScriptedServer(script) as simulator:
        config = config_urls(tmp_path / "eval", policy.base_url, simulator.base_url,
                             profiles_file(tmp_path, ("P1", "P2")))
        summary = run_benchmark(EvalSpec.from_config(config), progress=False)
        assert sum("Name: P2" in r["messages"][0]["content"] for r in simulator.requests) == 1  # never retried
    assert (summary["n"], summary["simulator_errors"], summary["score"]) == (1, 1, 100)
    by_id = {t["profile_id"]: t for t in read_jsonl(tmp_path / "eval" / "transcripts.jsonl")}
    assert by_id["id-P2"]["simulator_error"] and "HTTP 400" in by_id["id-P2"]["simulator_state"]["error"]
    assert by_id["id-P1"]["end_reason"] == "success"

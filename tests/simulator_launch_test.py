"""The simulator's entry points: the terminal chat and the SGLang launch script."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import urllib.request

import pytest

from rlver_jax import simulator
from tests.fixtures_cli import assert_one_line_error, fake_sglang, free_port, run_script

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, JAX_PLATFORMS="cpu")


def _chat(*flags, stdin=""):
    """launch/chat_with_simulator.py's main in this process (tests/fixtures_cli.run_script)."""
    return run_script("chat_with_simulator.py", *flags, stdin=stdin)


def test_chat_lists_profiles_and_plays_a_dialogue(tmp_path):
    listing = _chat("--list", "--config.backend=embedded")
    assert listing.returncode == 0, listing.stderr
    assert len(listing.stdout.splitlines()) == len(simulator.load_profiles())

    transcript = tmp_path / "t.json"
    run = _chat("--config.backend=embedded", "--profile=rlverjax-en-01",
                f"--transcript={transcript}",
                stdin="I'm so sorry, sleeping badly with that much work sounds exhausting. What happened?\n\n")
    assert run.returncode == 0, run.stderr
    assert re.search(r"emotion 30 -> (\d+) \(change \+\d+", run.stdout), run.stdout
    assert "user> I'm fine, mostly." in run.stdout and "-- end: stopped by you" in run.stdout
    state = simulator.DialogueState.from_dict(json.loads(transcript.read_text()))
    assert state.turns == 1 and state.emotion > 30

    bad = _chat("--config.backend=embedded", "--profile=nobody")
    assert bad.returncode != 0 and "--profile=nobody" in bad.stderr


def test_chat_refuses_a_server_field_with_the_embedded_backend():
    """The embedded simulator reads no server: a URL given with it would go unused. Refused in one
    line naming the chat's own flags, before any dialogue starts."""
    done = _chat("--config.backend=embedded", "--config.base_url=http://127.0.0.1:9/v1", "--profile=0")
    assert_one_line_error(done, 1, "--config.base_url set", "--config.backend='embedded'",
                          "--config.backend=openai")
    assert "config.simulator." not in done.stderr and "emotion" not in done.stdout


def _serve(tmp_path, *flags):
    env = dict(ENV, PYTHON=sys.executable, PYTHONPATH=str(fake_sglang(tmp_path)),
               FAKE_SGLANG_ARGS=str(tmp_path / "args.json"))
    return subprocess.run(["bash", str(REPO / "launch" / "serve_simulator.sh"),
                           "--log", str(tmp_path / "server.log"), *flags],
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.slow
def test_serve_script_waits_for_health_and_prints_the_url(tmp_path):
    port = free_port()
    run = _serve(tmp_path, "--model-path", "some/model", "--port", str(port), "--tp", "2",
                 "--detach", "--", "--mem-fraction-static", "0.8")
    pid = re.search(r"pid (\d+)", run.stderr)
    try:
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == f"http://127.0.0.1:{port}/v1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            assert answer.status == 200
        args = json.loads((tmp_path / "args.json").read_text())
        assert (args["model_path"], args["port"], args["tp"], args["served_model_name"]) == (
            "some/model", str(port), "2", "simulator")
        assert args["extra"] == ["--mem-fraction-static", "0.8"]
    finally:
        if pid:
            os.kill(int(pid[1]), signal.SIGTERM)


@pytest.mark.slow
def test_serve_script_reports_a_server_that_dies(tmp_path):
    run = _serve(tmp_path, "--model-path", "crash", "--port", str(free_port()), "--detach")
    assert run.returncode == 1
    assert "exited before becoming healthy" in run.stderr and "out of memory" in run.stderr
    assert run.stdout == ""

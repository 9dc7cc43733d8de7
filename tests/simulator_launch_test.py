"""The simulator's entry points: the terminal chat and the SGLang launch script."""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request

import pytest

from rlver_jax import simulator

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, JAX_PLATFORMS="cpu")


def _chat(*flags, stdin=""):
    return subprocess.run(
        [sys.executable, str(REPO / "launch" / "chat_with_simulator.py"), *flags],
        input=stdin, capture_output=True, text=True, env=ENV, timeout=60)


@pytest.mark.slow
def test_chat_lists_profiles_and_plays_a_dialogue(tmp_path):
    listing = _chat("--list", "--config.backend=embedded")
    assert listing.returncode == 0, listing.stderr
    assert len(listing.stdout.splitlines()) == len(simulator.load_profiles())

    transcript = tmp_path / "t.json"
    run = _chat("--config.backend=embedded", "--profile=rlverjax-en-01",
                f"--transcript={transcript}",
                stdin="I'm so sorry, that sounds exhausting. What happened?\n\n")
    assert run.returncode == 0, run.stderr
    assert re.search(r"emotion 30 -> (\d+) \(change \+\d+", run.stdout), run.stdout
    assert "user> I'm fine, mostly." in run.stdout and "-- end: stopped by you" in run.stdout
    state = simulator.DialogueState.from_dict(json.loads(transcript.read_text()))
    assert state.turns == 1 and state.emotion > 30

    bad = _chat("--config.backend=embedded", "--profile=nobody")
    assert bad.returncode != 0 and "--profile=nobody" in bad.stderr


_FAKE_SGLANG = textwrap.dedent("""
    import argparse, http.server, json, os, sys
    parser = argparse.ArgumentParser()
    for flag in ("--model-path", "--port", "--tp", "--host", "--served-model-name"):
        parser.add_argument(flag)
    args, extra = parser.parse_known_args()
    with open(os.environ["FAKE_SGLANG_ARGS"], "w") as f:
        json.dump({**vars(args), "extra": extra}, f)
    if args.model_path == "crash":
        print("fake sglang: out of memory")
        sys.exit(1)
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer((args.host, int(args.port)), Health).serve_forever()
""")


def _serve(tmp_path, *flags):
    package = tmp_path / "fake" / "sglang"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(_FAKE_SGLANG)
    env = dict(ENV, PYTHON=sys.executable, PYTHONPATH=str(tmp_path / "fake"),
               FAKE_SGLANG_ARGS=str(tmp_path / "args.json"))
    return subprocess.run(["bash", str(REPO / "launch" / "serve_simulator.sh"),
                           "--log", str(tmp_path / "server.log"), *flags],
                          capture_output=True, text=True, env=env, timeout=60)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_serve_script_waits_for_health_and_prints_the_url(tmp_path):
    port = _free_port()
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
    run = _serve(tmp_path, "--model-path", "crash", "--port", str(_free_port()), "--detach")
    assert run.returncode == 1
    assert "exited before becoming healthy" in run.stderr and "out of memory" in run.stderr
    assert run.stdout == ""

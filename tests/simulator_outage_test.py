"""A run outlives its simulator: the small tiny-GRPO run of launch/train.py against the scripted
simulator, undisturbed; then with the simulator down in the middle of step 0, answering HTTP 429
with Retry-After in step 1, then ten times slower than the client's timeout: the run ends with the
undisturbed run's metrics and transcripts, each step once, and the server answers no request
twice. A run whose simulator stays down past its outage budget saves, exits 75 with one
line naming the simulator and the time waited, and the same command resumes it to the same end.

Time runs in proportion: the issue's minutes are seconds here (a budget of 30 s, an outage of 3 s,
Retry-After 1 s, a budget of 4 s passed); benchmarks/simulator_outage.py runs the literal
scenarios."""

import collections
import hashlib
import json
import threading
import time

import pytest

from rlver_jax.files import read_jsonl
from rlver_jax.testing.scripted_server import ScriptedServer, route
from tests.faults_test import SMALL
from tests.fixtures_cli import run_script

STEPS = 2
TIMING = ("tokens_per_second", "update_tokens_per_second", "rollout_seconds", "update_seconds", "wait_seconds")
NOISE = ("logprob_diff_sampler",)  # the sampler's float noise, which depends on how its batches were formed
# SMALL's run with raw replies shown to the user (a random tiny model rarely closes its thought, and
# its dialogues would end before the simulator is asked), against a served simulator whose answers
# take 0.1 s, 1 s when slowed down: past the client's timeout_s.
FLAGS = [*SMALL, f"--config.train.steps={STEPS}", "--config.rollout.format_failure=continue",
         "--config.simulator.backend=openai", "--config.simulator.backoff_initial_s=0.05",
         "--config.simulator.backoff_max_s=0.5", "--config.simulator.timeout_s=0.6"]
DELAY_S = 0.1


def _digit(request, salt: str) -> int:
    text = json.dumps(request["messages"], sort_keys=True) + salt
    return int(hashlib.sha256(text.encode()).hexdigest(), 16)


def _emotion(request):
    return f"Intent: x\nFit: y\nInner reaction: z\nFeeling: w\nChange: {_digit(request, 'change') % 13 - 4:+d}"


def _reply(request):
    return f"Plan: go on\nResponse: I see, number {_digit(request, 'reply') % 997}."


SCRIPT = route(emotion=_emotion, reply=_reply)  # answers that are a function of the request


def _train(workdir, server, budget_s=30.0):
    done = run_script("train.py", *FLAGS, f"--config.workdir={workdir}", f"--config.simulator.base_url="
                      f"{server.base_url}", f"--config.simulator.outage_budget_s={budget_s}")
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def _at_request(server, n, fault):
    """Run `fault()` once the server has received `n` chat requests (a thread of its own)."""
    def watch():
        while len(server.requests) < n:
            time.sleep(0.005)
        fault()
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _outcome(workdir):
    """What a run leaves: its metrics without timings (the sampler's noise rounded), every transcript."""
    metrics = [{k: round(v, 4) if k in NOISE else v for k, v in m.items() if k not in TIMING}
               for m in read_jsonl(workdir / "metrics.jsonl")]
    return metrics, {p.name: read_jsonl(p) for p in sorted((workdir / "transcripts").iterdir())}


def _last_line(done):
    return [line for line in done.stderr.splitlines() if line.strip()][-1]


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("outage") / "undisturbed"
    with ScriptedServer(SCRIPT, delay_s=DELAY_S) as server:
        assert _train(workdir, server).returncode == 0
        assert _answered_once(server)
        answered = len(server.answered)  # about: the producer's batch after the last step is cut short
    metrics, transcripts = _outcome(workdir)
    assert [m["step"] for m in metrics] == list(range(STEPS)) and answered > 20 * STEPS
    return metrics, transcripts, answered


def _answered_once(server) -> bool:
    """No request was answered twice (a request the server lost going down was sent again, once)."""
    bodies = collections.Counter(json.dumps(server.requests[i], sort_keys=True) for i in server.answered)
    return max(bodies.values()) == 1


@pytest.mark.slow
@pytest.mark.xdist_group("simulator_outage")  # one worker runs the undisturbed run once for both tests
def test_down_throttled_and_slow_the_run_ends_as_undisturbed(undisturbed, tmp_path):
    metrics, transcripts, answered = undisturbed
    with ScriptedServer(SCRIPT, delay_s=DELAY_S) as server:
        faults = [_at_request(server, answered // 4, lambda: server.down(3.0)),  # in the middle of step 0
                  _at_request(server, answered // 2 + 4, lambda: server.throttle(2.5, retry_after_s=1.0)),
                  _at_request(server, 3 * answered // 4, lambda: server.slow_down(2.5, factor=10))]
        done = _train(tmp_path, server)
        assert done.returncode == 0, done.stderr[-3000:]
        for fault in faults:
            fault.join()
        assert server.downtimes and server.throttled
        for sent, retry_after in server.throttled:  # nothing sent in a window but what was sent before its 429
            assert not [t for t in server.arrivals if sent + 0.2 < t < sent + retry_after - 0.01], sent
        assert _answered_once(server)  # none sent again while the server worked on it
    assert "is down or throttled" in done.stderr and "answers again after" in done.stderr
    assert "it is slow, not down" in done.stderr
    assert _outcome(tmp_path) == (metrics, transcripts)


@pytest.mark.slow
@pytest.mark.xdist_group("simulator_outage")
def test_past_its_budget_a_run_saves_exits_75_and_resumes_to_the_same_end(undisturbed, tmp_path):
    metrics, transcripts, answered = undisturbed
    with ScriptedServer(SCRIPT, delay_s=DELAY_S) as server:  # down for good in the middle of step 1
        _at_request(server, 3 * answered // 4, lambda: server.down(60.0))
        done = _train(tmp_path, server, budget_s=4.0)
    assert done.returncode == 75, done.stderr[-3000:]
    line = _last_line(done)
    assert line.startswith(f"train.py: error: simulator at {server.base_url} did not answer for 4."), line
    assert ("the outage budget (config.simulator.outage_budget_s=4); last error: connection failed" in line
            and f"Stopped: the checkpoint of step 1 is in {tmp_path / 'checkpoints'}. Rerun the same command to "
                f"resume (config.workdir={tmp_path})." in line), line
    assert [m["step"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == [0]
    with ScriptedServer(SCRIPT, delay_s=DELAY_S) as server:  # back (a new port: how it is reached may change)
        assert _train(tmp_path, server).returncode == 0
    assert _outcome(tmp_path) == (metrics, transcripts)

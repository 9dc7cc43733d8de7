"""A run outlives its simulator: the small tiny-GRPO run of launch/train.py against the scripted
simulator (rlver_jax/testing/disturbed.py), undisturbed; then with the simulator down in the middle
of step 0, answering HTTP 429 with Retry-After in step 1, then ten times slower than the client's
timeout: the run ends with the undisturbed run's metrics and transcripts, each step once, no request
sent inside a Retry-After window and none answered twice. A run whose simulator stays down past its
outage budget saves, exits 75 with one line naming the simulator and the time waited, and the same
command resumes it to the same end.

Time runs in proportion: the issue's minutes are seconds here (an outage of 3 s, Retry-After 1 s
for 2.5 s, answers of 3 s past a timeout of 2 s for 3 s, a budget of 4 s passed);
benchmarks/simulator_outage.py runs the literal scenarios."""

import threading
import time

import pytest

from rlver_jax.files import read_jsonl
from rlver_jax.testing.disturbed import SIMULATOR, answered_twice, inside_retry_after, outcome, train_flags
from rlver_jax.testing.scripted_server import ScriptedServer
from tests.fixtures_cli import run_script

STEPS = 2
DELAY_S = 0.3  # each answer's time at the server; ten times that when slowed down, past timeout_s


def _train(workdir, server, budget_s=30.0):
    done = run_script("train.py", *train_flags(STEPS, workdir, server.base_url),
                      "--config.simulator.backoff_initial_s=0.05", "--config.simulator.backoff_max_s=0.5",
                      "--config.simulator.timeout_s=2", f"--config.simulator.outage_budget_s={budget_s}")
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def _down_after_step_0(server, workdir, stop: threading.Event) -> threading.Thread:
    """Take the server down for good once step 0's metrics are written: the run is strictly
    on-policy, so step 1's dialogues are in flight then (a request count would guess where step 0
    ends: the undisturbed run's count holds a cut-short extra batch of any size)."""
    def watch():
        while not stop.is_set():
            if (workdir / "metrics.jsonl").exists() and read_jsonl(workdir / "metrics.jsonl"):
                server.down(60.0)
                return
            time.sleep(0.02)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("outage") / "undisturbed"
    with ScriptedServer(SIMULATOR, delay_s=DELAY_S) as server:
        assert _train(workdir, server).returncode == 0
        assert answered_twice(server) == 0
        answered = len(server.answered)  # about: the producer's batch after the last step is cut short
    metrics, transcripts = outcome(workdir)
    assert [m["step"] for m in metrics] == list(range(STEPS)) and answered > 20 * STEPS
    return metrics, transcripts, answered


@pytest.mark.slow
@pytest.mark.xdist_group("simulator_outage")  # one worker runs the undisturbed run once for both tests
def test_down_throttled_and_slow_the_run_ends_as_undisturbed(undisturbed, tmp_path):
    metrics, transcripts, answered = undisturbed
    with ScriptedServer(SIMULATOR, delay_s=DELAY_S) as server:
        step = answered // (STEPS + 1)  # about a step's requests (the producer starts one more)
        server.at_request(step // 2, lambda: server.down(3.0))  # in the middle of step 0
        server.at_request(step + step // 3, lambda: server.throttle(2.5, retry_after_s=1.0))  # in step 1
        server.at_request(step + 2 * step // 3 + 4, lambda: server.slow_down(3.0, factor=10))
        done = _train(tmp_path, server)
        assert done.returncode == 0, done.stderr[-3000:]
        assert server.downtimes and server.throttled
        assert inside_retry_after(server) == 0 and answered_twice(server) == 0
    assert "is down or throttled" in done.stderr and "answers again after" in done.stderr
    assert "it is slow, not down" in done.stderr
    assert outcome(tmp_path) == (metrics, transcripts)


@pytest.mark.slow
@pytest.mark.xdist_group("simulator_outage")
def test_past_its_budget_a_run_saves_exits_75_and_resumes_to_the_same_end(undisturbed, tmp_path):
    metrics, transcripts, _ = undisturbed
    stop = threading.Event()
    with ScriptedServer(SIMULATOR, delay_s=DELAY_S) as server:  # down for good in the middle of step 1
        watcher = _down_after_step_0(server, tmp_path, stop)
        done = _train(tmp_path, server, budget_s=4.0)
        stop.set()
        watcher.join()
    assert done.returncode == 75, done.stderr[-3000:]
    line = [line for line in done.stderr.splitlines() if line.strip()][-1]
    assert line.startswith(f"train.py: error: simulator at {server.base_url} did not answer for 4."), line
    assert ("the outage budget (config.simulator.outage_budget_s=4); last error: connection failed" in line
            and f"Stopped: the checkpoint of step 1 is in {tmp_path / 'checkpoints'}. Rerun the same command to "
                f"resume (config.workdir={tmp_path})." in line), line
    assert [m["step"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == [0]
    with ScriptedServer(SIMULATOR, delay_s=DELAY_S) as server:  # back (a new port: how it is reached may change)
        assert _train(tmp_path, server).returncode == 0
    assert outcome(tmp_path) == (metrics, transcripts)

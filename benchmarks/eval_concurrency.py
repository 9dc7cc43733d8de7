r"""Evaluation against served models (issue 17): how far the requests of launch/eval.py overlap.

  .venv/bin/python benchmarks/eval_concurrency.py
  .venv/bin/python benchmarks/eval_concurrency.py --dialogues=5,30,100 --latency_s=0.3

launch/eval.py's code path (rlver_jax.eval.benchmark.run_benchmark with configs/eval.py, an openai
policy and an openai simulator, default group_size and max_dialogues) against one scripted
OpenAI-compatible server (rlver_jax/testing/scripted_server.py) that plays both and sleeps
`latency_s` per request, in a process of its own. The simulator answers "Change: 0" and never says
goodbye, so every dialogue runs all max_turns rounds: per round a policy reply, then the emotion
step and the reply step, one after the other (the last round's reply is not judged: SAGE).

Per --dialogues value it prints:
  wall: run_benchmark's seconds (the dialogues, the transcripts, report and plots);
  bound: the critical path, (requests of one dialogue) x latency: the dialogue's requests
    depend on each other, so no scheduler beats it; times the waves of groups when more
    dialogues than config.eval.max_dialogues (64) wait for a slot;
  sequential: every request one after the other, (all requests) x latency;
  peak: the most requests the server held at once;
  client CPU: this process's CPU seconds in run_benchmark: on a loaded machine, the wall beyond
    the bound is mostly this CPU time waiting for a core;
  set-up: run_benchmark's start to the server's first request (endpoint checks, clients);
  report: the last answer to run_benchmark's return (transcripts, report and plots).
and, once: the imports, the seconds of a fresh interpreter importing what launch/eval.py imports
(configs.eval and rlver_jax.eval.benchmark: no JAX), and the start-up, the seconds from starting
launch/eval.py (its own process, one dialogue, a server at no latency) to its first request.
Targets: wall <= 1.5 x bound, start-up <= ~5 s, sequential / wall >= 10 at 30 dialogues.
"""

import dataclasses
import json
import math
import multiprocessing
import os
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

from absl import app, flags  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

_DIALOGUES = flags.DEFINE_list("dialogues", ["5", "30", "100"], "Dialogue counts to time, one run each.")
_LATENCY = flags.DEFINE_float("latency_s", 0.3, "Server sleep per request (policy and simulator alike), > 0.")
flags.register_validator("latency_s", lambda v: v > 0, "--latency_s must be > 0: the bound is counted in latencies")

REPO = pathlib.Path(__file__).resolve().parents[1]
_EMOTION_ANSWER = "Analysis: the reply is neither helpful nor hurtful.\nChange: 0"
_REPLY_ANSWER = "Plan: keep talking.\nResponse: I see. Tell me more about it."
_POLICY_ANSWER = "That sounds like a lot to carry. What weighs on you most?"
# What launch/eval.py imports before its first dialogue, in a fresh interpreter (served policy
# and simulator: no JAX, benchmark.needs_jax).
_STARTUP = ("import time; t = time.perf_counter(); import configs.eval; "
            "from rlver_jax.eval import benchmark; print(time.perf_counter() - t)")


@dataclasses.dataclass(frozen=True)
class Timing:
    dialogues: int
    wall_s: float
    bound_s: float  # critical path: one dialogue's requests one after the other
    sequential_s: float  # every request one after the other
    requests: int
    peak_in_flight: int
    cpu_s: float  # CPU seconds of this process (the client: eval.py's work) during the run
    setup_s: float  # from run_benchmark's call to the server's first request
    report_s: float  # from the last answer (last arrival + latency) to run_benchmark's return

    def line(self) -> str:
        return (f"{self.dialogues:4d} dialogues  {self.requests:5d} requests  wall {self.wall_s:6.1f} s  "
                f"bound {self.bound_s:5.1f} s  wall/bound {self.wall_s / self.bound_s:4.2f}  "
                f"sequential {self.sequential_s:6.1f} s  speed-up {self.sequential_s / self.wall_s:5.1f}x  "
                f"peak in flight {self.peak_in_flight}  client CPU {self.cpu_s:.1f} s  "
                f"set-up {self.setup_s:.2f} s  report {self.report_s:.2f} s")


def write_profiles(path: pathlib.Path, n: int) -> None:
    """n profiles with unique ids and a first_talk (SAGE opens with it), cycling the shipped set."""
    from rlver_jax.simulator.profiles import load_profiles
    shipped = load_profiles()
    with path.open("w") as f:
        for i in range(n):
            record = shipped[i % len(shipped)].to_dict()
            record["id"] = f"bench-{i}"
            record["first_talk"] = record.get("first_talk") or "I had a long week."
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def eval_config(workdir: pathlib.Path, profiles: pathlib.Path, base_url: str):
    """configs/eval.py (SAGE) with an openai policy and simulator at `base_url`, defaults otherwise."""
    from configs.eval import get_config
    c = get_config()
    c.workdir, c.eval.profiles = str(workdir), str(profiles)
    c.policy.backend, c.policy.base_url, c.policy.model = "openai", base_url, "simulator"
    c.simulator.backend, c.simulator.base_url, c.simulator.model = "openai", base_url, "simulator"
    return c


def _answer(request):
    from rlver_jax.testing.scripted_server import route
    return route(emotion=lambda r: _EMOTION_ANSWER, reply=lambda r: _REPLY_ANSWER,
                 policy=lambda r: _POLICY_ANSWER)(request)


def serve(latency_s: float, conn) -> None:
    """The scripted server in its own process (a served model's requests cost the client's
    interpreter nothing): sends its base_url, then (requests, peak in flight, first and last
    arrival) when told to stop; time.perf_counter is the machine's monotonic clock, the same in
    both processes."""
    from rlver_jax.testing.scripted_server import ScriptedServer
    with ScriptedServer(_answer, delay_s=latency_s) as server:
        conn.send(server.base_url)
        conn.recv()
        conn.send((len(server.requests), server.peak_in_flight, server.arrivals[0], server.arrivals[-1]))


def time_run(dialogues: int, latency_s: float, root: pathlib.Path) -> Timing:
    from rlver_jax.eval.benchmark import run_benchmark
    from rlver_jax.eval.spec import EvalSpec

    profiles = root / f"profiles_{dialogues}.jsonl"
    write_profiles(profiles, dialogues)
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(latency_s, theirs), daemon=True)
    server.start()
    try:
        config = eval_config(root / f"eval_{dialogues}", profiles, ours.recv())
        start, cpu = time.perf_counter(), time.process_time()
        summary = run_benchmark(EvalSpec.from_config(config), progress=False)
        end = time.perf_counter()
        wall, cpu = end - start, time.process_time() - cpu
        ours.send("stop")
        requests, peak, first, last = ours.recv()
    finally:
        server.join(timeout=10)
        if server.is_alive():
            server.kill()
    if summary["n"] != dialogues or summary["simulator_errors"]:
        raise RuntimeError(f"expected {dialogues} scored dialogues, got {summary['n']} "
                           f"({summary['simulator_errors']} simulator errors)")
    per_dialogue = requests / dialogues  # all dialogues run the same rounds
    # Groups of group_size, max_dialogues // group_size groups in flight: later groups wait.
    groups, slots = math.ceil(dialogues / config.eval.group_size), config.eval.max_dialogues // config.eval.group_size
    waves = math.ceil(groups / slots)
    return Timing(dialogues, wall, waves * per_dialogue * latency_s, requests * latency_s, requests, peak, cpu,
                  first - start, end - last - latency_s)


def imports_s() -> float:
    done = subprocess.run([sys.executable, "-c", _STARTUP], capture_output=True, text=True, cwd=REPO, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return float(done.stdout.split()[-1])


def first_request_s(root: pathlib.Path) -> tuple[float, float]:
    """(seconds to the first request, seconds in all) of `launch/eval.py` itself, a fresh process
    playing one dialogue against the scripted server at no latency."""
    from rlver_jax.testing.scripted_server import ScriptedServer

    profiles = root / "profiles_startup.jsonl"
    write_profiles(profiles, 1)
    with ScriptedServer(_answer) as server:
        url = server.base_url
        command = [sys.executable, str(REPO / "launch/eval.py"), "--config=configs/eval.py",
                   f"--config.workdir={root / 'eval_startup'}", f"--config.eval.profiles={profiles}",
                   "--config.policy.backend=openai", f"--config.policy.base_url={url}",
                   "--config.policy.model=simulator", "--config.simulator.backend=openai",
                   f"--config.simulator.base_url={url}", "--config.simulator.model=simulator"]
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
        return server.arrivals[0] - start, time.perf_counter() - start


def main(argv):
    del argv
    absl_logging.set_verbosity(absl_logging.ERROR)  # as launch/eval.py: no line per HTTP request
    print(f"imports of launch/eval.py: {imports_s():.1f} s")
    with tempfile.TemporaryDirectory() as tmp:
        first, total = first_request_s(pathlib.Path(tmp))
        print(f"start-up: launch/eval.py's first request {first:.1f} s after its start (one dialogue at no "
              f"latency: {total:.1f} s in all)", flush=True)
        for n in (int(d) for d in _DIALOGUES.value):
            print(time_run(n, _LATENCY.value, pathlib.Path(tmp)).line(), flush=True)


if __name__ == "__main__":
    app.run(main)

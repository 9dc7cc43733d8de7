r"""A run outlives its simulator, at the issue's own durations: the small tiny-GRPO run of
launch/train.py (rlver_jax/testing/disturbed.py, 3 steps) against the scripted simulator, its
answers taking 1 s, the client's timeout_s 5 s, the default outage budget (30 minutes) and
backoff. Never in CI: about 15 minutes, most of it the faults' own time.

  .venv/bin/python benchmarks/simulator_outage.py --out=/tmp/simulator_outage

Each scenario starts its fault in the middle of step 1 (by the undisturbed run's requests a step):
  undisturbed  the reference
  down         the simulator gone for 150 s (connections refused, the requests in work lost), then back
  throttled    HTTP 429 with `Retry-After: 20` to every request for 60 s
  slow         every answer ten times slower (10 s, past timeout_s) for 60 s
  budget       gone for 150 s under --config.simulator.outage_budget_s=90: the run saves and exits 75;
               the same command, run again at once, waits for the simulator and finishes the run
               (both with --config.simulator.cache_dir, so the step played again asks nothing twice)
Each run is `launch/train.py` in a process of its own. For each: its wall time, exit status(es),
whether its metrics (timings aside) and transcripts equal the undisturbed run's, the requests the
server answered twice and those that came inside a Retry-After window, and the run's own lines
about the simulator. The table goes to stdout and OUT/summary.md.
"""

import pathlib
import shutil
import subprocess
import sys
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

from rlver_jax.testing.disturbed import (  # noqa: E402
    SIMULATOR,
    answered_twice,
    inside_retry_after,
    outcome,
    train_flags,
)
from rlver_jax.testing.scripted_server import ScriptedServer  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SCENARIOS = ("undisturbed", "down", "throttled", "slow", "budget")
_OUT = flags.DEFINE_string("out", "/tmp/simulator_outage", "Work directories and summary.md go here.")
_SCENARIOS = flags.DEFINE_list("scenarios", list(SCENARIOS), f"Which of {SCENARIOS}, in this order.")
_STEPS = flags.DEFINE_integer("steps", 3, "Training steps of each run.")
_DELAY = flags.DEFINE_float("delay_s", 1.0, "Each simulator answer's time (ten times that when slowed down).")
_TIMEOUT = flags.DEFINE_float("timeout_s", 5.0, "config.simulator.timeout_s.")
_SAID = ("down or throttled", "answers again", "still down", "slow, not down", "error:")


def _train(workdir: pathlib.Path, server: ScriptedServer, *extra: str) -> tuple[int, str, float]:
    """(exit status, stderr, seconds) of launch/train.py against `server`."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "launch/train.py", *train_flags(_STEPS.value, workdir, server.base_url),
                           f"--config.simulator.timeout_s={_TIMEOUT.value}", *extra],
                          cwd=REPO, capture_output=True, text=True)
    return done.returncode, done.stderr, time.perf_counter() - start


def _said(stderr: str) -> list[str]:
    """The run's lines about the simulator, from "train.py: " on (a progress bar before one on its
    line left out)."""
    lines = (line[line.find("train.py: "):] for line in stderr.split("\n") if "train.py: " in line)
    return [line for line in lines if any(words in line for words in _SAID)]


def _scenario(name: str, out: pathlib.Path, reference: dict | None) -> dict:
    workdir = out / name
    shutil.rmtree(workdir, ignore_errors=True)
    step = reference["answered"] // (_STEPS.value + 1) if reference else 0  # the producer starts one step more
    with ScriptedServer(SIMULATOR, delay_s=_DELAY.value) as server:
        fault = {"down": lambda: server.down(150.0), "throttled": lambda: server.throttle(60.0, retry_after_s=20.0),
                 "slow": lambda: server.slow_down(60.0, factor=10), "budget": lambda: server.down(150.0)}.get(name)
        if fault is not None:
            server.at_request(step + step // 2, fault)
        # The budget's run keeps the answers (config.simulator.cache_dir): its rerun, which plays the
        # step it stopped in again, asks the simulator only what it had not answered.
        extra = (["--config.simulator.outage_budget_s=90", f"--config.simulator.cache_dir={workdir / 'answers'}"]
                 if name == "budget" else [])
        status, stderr, seconds = _train(workdir, server, *extra)
        statuses, said = [status], _said(stderr)
        if name == "budget":  # the same command again at once: it waits for the simulator at start-up
            status, stderr, more = _train(workdir, server, *extra)
            statuses, seconds, said = statuses + [status], seconds + more, said + ["(rerun)"] + _said(stderr)
        row = {"scenario": name, "seconds": seconds, "exit": statuses, "answered": len(server.answered),
               "answered twice": answered_twice(server), "inside Retry-After": inside_retry_after(server),
               "said": said}
    if statuses[-1] == 0:
        row["outcome"] = outcome(workdir)
    return row


def _table(rows: list[dict], reference: dict | None) -> str:
    lines = ["| scenario | wall s | exit | equal to undisturbed | answered twice | inside Retry-After | said |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        equal = "-" if reference is None or r is reference else str(r.get("outcome") == reference.get("outcome"))
        said = "<br>".join(r["said"]) or "-"
        lines.append(f"| {r['scenario']} | {r['seconds']:.0f} | {' then '.join(map(str, r['exit']))} | {equal} | "
                     f"{r['answered twice']} | {r['inside Retry-After']} | {said} |")
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    rows, reference = [], None
    for name in _SCENARIOS.value:
        if name not in SCENARIOS:
            raise app.UsageError(f"--scenarios: {name!r} is none of {SCENARIOS}")
        rows.append(_scenario(name, out, reference))
        if name == "undisturbed":
            reference = rows[-1]
        print(_table(rows[-1:], reference), flush=True)
    summary = _table(rows, reference)
    (out / "summary.md").write_text(summary)
    print(summary)


if __name__ == "__main__":
    app.run(main)

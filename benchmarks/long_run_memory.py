r"""Resident memory of a long training run (issue 29): does it stay flat after warm-up?

  PYTHONPATH=$PWD .venv/bin/python benchmarks/long_run_memory.py
  PYTHONPATH=$PWD .venv/bin/python benchmarks/long_run_memory.py --config=configs/grpo_think.py:tiny \
      --steps=120 --workdir=/tmp/memory_run -- --config.train.eval_every=10

Runs launch/train.py (its own process, the preset's defaults but for train.steps and the work
directory, plus any flags after `--`) and samples the process's resident set size (VmRSS, with
its children) every `interval_s`; a step's RSS is the sample taken when its line appears in
metrics.jsonl, after its update, in-loop evaluation (every eval_every steps) and transcripts.
Prints one row per `every` steps and the verdict: the last step's RSS over step `reference`'s
(warm-up done: every program compiled, the first evaluations run), target <= 1.25, and the peak.
`--out=FILE` writes every step's numbers as JSON.
"""

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import time

_ROOT = pathlib.Path(__file__).resolve().parents[1]


def rss_bytes(pid: int) -> int:
    """VmRSS of `pid` and its descendants (0 for one that has gone)."""
    total = 0
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
        total = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))
        children = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except (OSError, StopIteration):
        return total
    return total + sum(rss_bytes(int(c)) for c in children)


def steps_written(path: pathlib.Path) -> list[int]:
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip().endswith("}")]


def measure(config: str, steps: int, workdir: pathlib.Path, extra: list[str], interval_s: float
            ) -> tuple[int, dict[int, int], int, float]:
    """(exit status, RSS per step, peak RSS, seconds) of one launch/train.py run."""
    command = [sys.executable, str(_ROOT / "launch" / "train.py"), f"--config={config}",
               f"--config.workdir={workdir}", f"--config.train.steps={steps}", *extra]
    log = open(workdir.parent / f"{workdir.name}.log", "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, cwd=_ROOT, stdout=log, stderr=subprocess.STDOUT)
    per_step: dict[int, int] = {}
    peak = 0
    metrics = workdir / "metrics.jsonl"
    while proc.poll() is None:
        rss = rss_bytes(proc.pid)
        peak = max(peak, rss)
        for step in steps_written(metrics):
            per_step.setdefault(step, rss)
        time.sleep(interval_s)
    log.close()
    return proc.returncode, per_step, peak, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/ppo_think.py:tiny")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--workdir", default="/tmp/rlver_long_run_memory")
    parser.add_argument("--reference", type=int, default=20, help="the step after warm-up the end is compared with")
    parser.add_argument("--every", type=int, default=10, help="print every N-th step")
    parser.add_argument("--interval_s", type=float, default=0.5)
    parser.add_argument("--out", default="", help="JSON file of every step's RSS")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    workdir = pathlib.Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)  # a fresh run, not a resume
    workdir.parent.mkdir(parents=True, exist_ok=True)
    rc, per_step, peak, seconds = measure(args.config, args.steps, workdir, extra, args.interval_s)
    mib = lambda b: b / 2**20  # noqa: E731
    print(f"{args.config}, {args.steps} steps: exit {rc} after {seconds:.0f} s (log: {workdir}.log)")
    print("step  RSS MiB")
    for step in sorted(per_step):
        if step % args.every == args.every - 1 or step in (0, args.reference):
            print(f"{step:4d}  {mib(per_step[step]):8.1f}")
    if args.reference in per_step and per_step:
        last = max(per_step)
        ratio = per_step[last] / per_step[args.reference]
        print(f"step {last} / step {args.reference}: {mib(per_step[last]):.1f} / "
              f"{mib(per_step[args.reference]):.1f} MiB = {ratio:.3f} (target <= 1.25); peak {mib(peak):.1f} MiB")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({"config": args.config, "steps": args.steps, "exit": rc,
                                                      "seconds": seconds, "peak": peak,
                                                      "rss": {str(k): v for k, v in sorted(per_step.items())}}))
    sys.exit(rc)


if __name__ == "__main__":
    main()

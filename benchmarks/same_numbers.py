r"""Whether a refactor changed any number: the tiny presets trained from this checkout and from
another commit, their metrics (timings left out) and transcripts compared exactly.

  .venv/bin/python benchmarks/same_numbers.py --base=db91297 --out=/tmp/same_numbers
  .venv/bin/python benchmarks/same_numbers.py --base=HEAD~3 --presets=grpo_think,ppo_nothink --steps=6
  .venv/bin/python benchmarks/same_numbers.py --base=afb4a93 --flags=--config.simulator.max_turns=3 \
      --head_flags=--config.rl.pack_rows=True --rtol=1e-5

Each preset runs `--steps` steps with an in-loop evaluation every `--eval_every`, once from a
temporary worktree of `--base` and once from this checkout (both with `--flags`, this checkout's
also with `--head_flags`), with the same interpreter (this venv's). Prints IDENTICAL, or the first
differences; exit status 0 when identical, 1 otherwise. With `--rtol` a number (a metric, or one
in a transcript) may differ by that much relative to the larger of 1 and its size (a change of
summation order: packed rows), and a run that differs only so prints WITHIN RTOL; the rest is
compared exactly. Transcript keys that only one side writes (a field added on purpose) are listed,
not compared; so is `logprob_diff_sampler` where it differs by at most 1e-6 (the sampler's float
order: which rows share an engine call depends on the machine's timing; no token changes).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

from absl import app, flags

REPO = pathlib.Path(__file__).resolve().parents[1]
_BASE = flags.DEFINE_string("base", None, "The commit to compare with (a hash, HEAD~1, a branch).")
_PRESETS = flags.DEFINE_list("presets", ["grpo_think", "ppo_think"], "Config files of configs/, their tiny preset.")
_STEPS = flags.DEFINE_integer("steps", 4, "Training steps of each run.")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 2, "In-loop evaluation every N steps (0: none).")
_OUT = flags.DEFINE_string("out", None, "Directory for the runs (default: a temporary one).")
_FLAGS = flags.DEFINE_list("flags", [], "More flags of every run (e.g. --config.simulator.max_turns=3).")
_HEAD_FLAGS = flags.DEFINE_list("head_flags", [], "More flags of this checkout's runs (--config.rl.pack_rows=True).")
_RTOL = flags.DEFINE_float("rtol", 0.0, "Numbers equal within this, relative to max(1, |x|) (0: exactly).")
_TIMING = ("seconds", "per_second")  # metrics that measure the machine, not the run
# Metrics of the sampler's float order against the trainer's: which rows share an engine call depends
# on when each turn arrives (the machine's timing), and a call's shape moves its sums by ~1e-9, never a
# token. Equal within _ORDER_ATOL, and said so.
_ORDER = ("logprob_diff_sampler",)
_ORDER_ATOL = 1e-6


def train(tree: pathlib.Path, preset: str, workdir: pathlib.Path, more: list[str]) -> None:
    """launch/train.py of `tree` on configs/PRESET.py:tiny, into `workdir`, with the flags `more`."""
    done = subprocess.run([sys.executable, "launch/train.py", f"--config=configs/{preset}.py:tiny",
                           f"--config.workdir={workdir}", f"--config.train.steps={_STEPS.value}",
                           f"--config.train.eval_every={_EVAL_EVERY.value}", *more],
                          cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: {preset} failed:\n{done.stderr[-3000:]}")


def same(x, y, rtol: float = 0.0) -> bool:
    """Equal; numbers within `rtol` relative to max(1, |x|, |y|), in lists and dicts alike."""
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(same(x[k], y[k], rtol) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(same(a, b, rtol) for a, b in zip(x, y))
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
    return x == y or (numbers and abs(x - y) <= rtol * max(1.0, abs(x), abs(y)))


def differences(a: pathlib.Path, b: pathlib.Path, rtol: float = 0.0) -> tuple[list[str], set[str]]:
    """(what differs between two runs' metrics and transcripts beyond `rtol`, what was not compared: transcript
    keys one side lacks, float-order metrics within _ORDER_ATOL)."""
    out, extra = [], set()
    rows = [[json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()] for d in (a, b)]
    if len(rows[0]) != len(rows[1]):
        out.append(f"{len(rows[0])} vs {len(rows[1])} metric lines")
    for x, y in zip(*rows):
        for k in sorted(x.keys() | y.keys()):
            u, v = x.get(k, "<missing>"), y.get(k, "<missing>")
            if any(t in k for t in _TIMING) or same(u, v, rtol):
                continue
            if k in _ORDER and isinstance(u, float) and isinstance(v, float) and abs(u - v) <= _ORDER_ATOL:
                extra.add(f"{k} (float order, within {_ORDER_ATOL:g})")
                continue
            out.append(f"step {x.get('step')}: {k} {u} vs {v}")
    names = [sorted(p.name for p in (d / "transcripts").iterdir()) for d in (a, b)]
    if names[0] != names[1]:
        out.append(f"transcript files {names[0]} vs {names[1]}")
    for name in set(names[0]) & set(names[1]):
        records = [(d / "transcripts" / name).read_text().splitlines() for d in (a, b)]
        if len(records[0]) != len(records[1]):
            out.append(f"{name}: {len(records[0])} vs {len(records[1])} records")
        for i, (x, y) in enumerate(zip(*records)):
            x, y = json.loads(x), json.loads(y)
            extra |= {f"{k} (one side's transcripts)" for k in x.keys() ^ y.keys()}
            out += [f"{name} record {i}: {k} differs" for k in sorted(x.keys() & y.keys())
                    if not same(x[k], y[k], rtol)]
    return out, extra


def main(argv):
    del argv
    out = pathlib.Path(_OUT.value or tempfile.mkdtemp(prefix="same_numbers_"))
    base_tree = out / "base_tree"
    subprocess.run(["git", "worktree", "add", "--detach", "--force", str(base_tree), _BASE.value], cwd=REPO,
                   check=True, capture_output=True)
    try:
        found = {}
        for preset in _PRESETS.value:
            sides = (("base", base_tree, _FLAGS.value), ("head", REPO, _FLAGS.value + _HEAD_FLAGS.value))
            for side, tree, more in sides:
                train(tree, preset, out / side / preset, more)
            found[preset] = (differences(out / "base" / preset, out / "head" / preset),
                             differences(out / "base" / preset, out / "head" / preset, _RTOL.value))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPO, capture_output=True)
    agree = True
    for preset, ((exact, extra), (beyond, _)) in found.items():
        if extra:
            print(f"{preset}: not compared exactly: {', '.join(sorted(extra))}")
        verdict = "IDENTICAL" if not exact else f"WITHIN RTOL {_RTOL.value:g} ({len(exact)} numbers differ)"
        print(f"{preset}: " + (verdict if not beyond else "DIFFERENT\n  " + "\n  ".join(beyond[:20])))
        agree = agree and not beyond
    sys.exit(0 if agree else 1)


if __name__ == "__main__":
    flags.mark_flag_as_required("base")
    app.run(main)

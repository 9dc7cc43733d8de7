r"""The training step with packed rows against a base commit's padded update (issue 62): the
rollout and update seconds of real training runs, side by side on one host.

  .venv/bin/python benchmarks/packed_step.py --base=eb94431 --out=/tmp/packed_step
  .venv/bin/python benchmarks/packed_step.py --base=eb94431 --runs=grpo_think:tiny:3 --sides=base,packed,padded

Each run CONFIG:PRESET:TURNS is configs/CONFIG.py:PRESET with config.simulator.max_turns=TURNS (0: the
preset's), trained for --steps steps (no in-loop evaluation, no checkpoint before the end, the XLA compilation
cache off so that every side compiles its own programs) by each side in turn: `base`, a temporary
worktree of --base (its padded update); `packed`, this checkout with config.rl.pack_rows=True;
`padded`, this checkout with it off. Every side plays the same dialogues at step 0 (the same seed and
weights); later steps sample from the weights each side trained, so their dialogues may differ.
Each side's seconds a step come from its metrics.jsonl (rollout_seconds, update_seconds); the table
gives their medians over the steps after the first (which compiles), with the first step's apart.
The packed side's log says how its rows packed (its DEBUG lines of rlver_jax.rl.program).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

REPO = pathlib.Path(__file__).resolve().parents[1]
_BASE = flags.DEFINE_string("base", None, "The commit whose padded update is the baseline (e.g. eb94431).")
_RUNS = flags.DEFINE_list("runs", ["grpo_nothink:smol:0", "grpo_think:smol:4"],
                          "CONFIG:PRESET:TURNS per run: configs/CONFIG.py:PRESET, simulator.max_turns (0: preset's).")
_SIDES = flags.DEFINE_list("sides", ["base", "packed"], "Sides in the order they run: base, packed, padded.")
_STEPS = flags.DEFINE_integer("steps", 4, "Training steps of each side (the first compiles).")
_OUT = flags.DEFINE_string("out", None, "Directory for the runs (default: a temporary one).")
_PACKED = re.compile(r"packed rows: (.*)")


def train(tree: pathlib.Path, config: str, preset: str, turns: int, pack: bool | None, workdir: pathlib.Path) -> str:
    """launch/train.py of `tree` on configs/CONFIG.py:PRESET into `workdir`; its log. pack None: the
    tree's default (a base without the field)."""
    args = [sys.executable, "launch/train.py", f"--config=configs/{config}.py:{preset}", f"--config.workdir={workdir}",
            f"--config.train.steps={_STEPS.value}", "--config.train.eval_every=0", "--config.compilation_cache_dir=",
            f"--config.checkpoint.save_every={_STEPS.value}"]
    if turns:
        args.append(f"--config.simulator.max_turns={turns}")
    if pack is not None:
        args += [f"--config.rl.pack_rows={pack}", "--logger_levels=rlver_jax.rl.program:DEBUG"]
    done = subprocess.run(args, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: {config}:{preset} failed (exit status {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stderr


def seconds(workdir: pathlib.Path) -> dict[str, list[float]]:
    """Each step's rollout and update seconds from a run's metrics.jsonl."""
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {k: [r[f"{k}_seconds"] for r in rows] for k in ("rollout", "update")}


def summary(side: str, times: dict[str, list[float]]) -> str:
    """A table row: medians over the steps after the first, the first step's, the step's."""
    rollout, update = (statistics.median(times[k][1:]) for k in ("rollout", "update"))
    return (f"| {side} | {rollout:.1f} | {update:.1f} | {rollout + update:.1f} | {times['rollout'][0]:.1f} | "
            f"{times['update'][0]:.1f} | {', '.join(f'{u:.1f}' for u in times['update'][1:])} |")


def main(argv):
    del argv
    out = pathlib.Path(_OUT.value or tempfile.mkdtemp(prefix="packed_step_"))
    base_tree = out / "base_tree"
    if "base" in _SIDES.value:
        subprocess.run(["git", "worktree", "add", "--detach", "--force", str(base_tree), _BASE.value], cwd=REPO,
                       check=True, capture_output=True)
    trees = {"base": (base_tree, None), "packed": (REPO, True), "padded": (REPO, False)}
    tables = []
    try:
        for spec in _RUNS.value:
            config, preset, turns = spec.split(":")
            rows = []
            for side in _SIDES.value:
                tree, pack = trees[side]
                workdir = out / f"{config}_{preset}_{turns}" / side
                log = train(tree, config, preset, int(turns), pack, workdir)
                rows.append(summary(side, seconds(workdir)))
                print(f"{spec} {side}: {rows[-1]}  load {os.getloadavg()[0]:.1f}", flush=True)
                for line in sorted(set(m.group(1) for m in _PACKED.finditer(log))):
                    print(f"  {line}", flush=True)
            tables.append((spec, rows))
    finally:
        if "base" in _SIDES.value:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPO, capture_output=True)
    print(f"\n{_STEPS.value} steps a side; seconds: medians over steps 1-{_STEPS.value - 1}, step 0 (compiles) apart")
    for spec, rows in tables:
        print(f"\n{spec}\n| side | rollout s | update s | step s | step 0 rollout s | step 0 update s "
              "| update s by step |\n|---|---:|---:|---:|---:|---:|---|")
        print("\n".join(rows))


if __name__ == "__main__":
    app.run(main)

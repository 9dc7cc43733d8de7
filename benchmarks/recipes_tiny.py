r"""Each RL recipe of the algorithm table (rlver_jax.rl.algorithms) on the tiny think preset for its
default 40 steps (issue 40): what each does on our problem, side by side. Never in CI: about 4
minutes a recipe on an idle core, 9 recipes.

  .venv/bin/python benchmarks/recipes_tiny.py --out=/tmp/recipes_tiny                 # every recipe
  .venv/bin/python benchmarks/recipes_tiny.py --out=/tmp/recipes_tiny --algos=grpo,rloo

Every run is the project's own command, `launch/train.py --config=configs/{ppo,grpo}_think.py:tiny
--config.rl.algo=ALGO` (ppo from the PPO preset, every other recipe from the GRPO one, whose rows
and groups the recipe's row resolves), in OUT/ALGO; a rerun resumes or skips finished runs. Then
OUT/summary.md: per recipe the mean reward of the first and the last 10 steps, the format-failure
share (dialogues ended by a reply without its think block) over the same steps, the mean entropy of
the last 10, the in-loop evaluation's score at the first and the last evaluation, and the minutes
the run took; then, per in-loop evaluation, what the held-out score is made of (judged turns per
dialogue, the mean emotion change of a turn, the share of replies sent raw for want of `</think>`,
the shares the rules judged curt or garbage, the mean length of what the user read, how the
dialogues ended): why the score falls while the training reward rises (docs/benchmarks.md).
With --figures=DIR each run's reward.png is copied to DIR/ALGO_think_tiny_reward.png (docs/training.md's figures:
--algos=grpo,ppo --figures=docs/img).
"""

import collections
import json
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runs from a checkout

from rlver_jax.rl.algorithms import ALGORITHMS  # noqa: E402

_OUT = flags.DEFINE_string("out", "/tmp/recipes_tiny", "Directory for the runs and summary.md (reruns resume).")
_ALGOS = flags.DEFINE_list("algos", list(ALGORITHMS), "Recipes (config.rl.algo) to run.")
_WINDOW = flags.DEFINE_integer("window", 10, "Steps averaged at the start and at the end.")
_FLAGS = flags.DEFINE_list("train_flags", [], "Extra launch/train.py flags for every run (commas separate flags).")
_FIGURES = flags.DEFINE_string("figures", "", "Copy each run's reward.png to DIR/ALGO_think_tiny_reward.png "
                                "(\"\": no copies).")


def run(name: str, out: pathlib.Path, preset: str, args: list[str]) -> float:
    """Runs (or resumes) `launch/train.py --config=configs/PRESET.py:tiny ARGS` in OUT/NAME (log
    OUT/NAME.log); the minutes it has taken over every call, kept in OUT/minutes.json (a call
    that finds the run finished adds almost nothing)."""
    cmd = [sys.executable, "launch/train.py", f"--config=configs/{preset}.py:tiny", f"--config.workdir={out / name}",
           *args]
    t0 = time.time()
    with open(out / f"{name}.log", "a") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc:
        raise SystemExit(f"{name}: exit {rc}, see {out / f'{name}.log'}")
    timing = out / "minutes.json"
    minutes = json.loads(timing.read_text()) if timing.exists() else {}
    minutes[name] = minutes.get(name, 0.0) + (time.time() - t0) / 60
    timing.write_text(json.dumps(minutes))
    return minutes[name]


def train(algo: str, out: pathlib.Path) -> float:
    """Runs (or resumes) the recipe's training in OUT/ALGO; its minutes over every call."""
    preset = "ppo_think" if algo == "ppo" else "grpo_think"
    return run(algo, out, preset, [f"--config.rl.algo={algo}", *_FLAGS.value])


def summarise(algo: str, workdir: pathlib.Path, window: int, minutes: float) -> dict:
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line]
    first, last = lines[:window], lines[-window:]

    def mean(rows, key):
        return float(np.mean([r[key] for r in rows if key in r]))

    evals = [r["eval_score"] for r in lines if "eval_score" in r]
    return {"algo": algo, "steps": len(lines), "reward_first": mean(first, "reward_mean"),
            "reward_last": mean(last, "reward_mean"), "format_first": mean(first, "format_failure_rate"),
            "format_last": mean(last, "format_failure_rate"), "entropy_last": mean(last, "entropy"),
            "eval_first": evals[0] if evals else None, "eval_last": evals[-1] if evals else None,
            "minutes": minutes}


def table(rows: list[dict], window: int) -> str:
    head = (f"| recipe | steps | reward, first {window} | reward, last {window} | format failures, first -> last "
            f"| entropy, last {window} | in-loop eval score, first -> last | minutes |\n"
            "|---|---:|---:|---:|---|---:|---|---:|\n")
    body = "".join(
        f"| {r['algo']} | {r['steps']} | {r['reward_first']:.3f} | {r['reward_last']:.3f} | "
        f"{r['format_first']:.0%} -> {r['format_last']:.0%} | {r['entropy_last']:.2f} | "
        f"{r['eval_first']:.1f} -> {r['eval_last']:.1f} | {r['minutes']:.1f} |\n" for r in rows)
    return head + body


def evaluations(algo: str, workdir: pathlib.Path) -> list[dict]:
    """What each in-loop evaluation's score is made of, from its transcripts (WORKDIR/transcripts/
    eval_STEP.jsonl): the judged turns (those with an emotion change), and what the user read (the
    reply after </think>, or the raw text when the reply had none: format_failure=continue)."""
    rows = []
    for path in sorted((workdir / "transcripts").glob("eval_*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines() if line]
        judged = [t for r in records for t in r["turns"] if "change" in t]
        thoughts = [t.get("simulator_thoughts", "") for t in judged]
        rows.append({"algo": algo, "step": int(path.stem.split("_")[1]),
                     "score": float(np.mean([r["final_emotion"] for r in records])),
                     "turns": len(judged) / len(records),
                     "change": float(np.mean([t["change"] for t in judged])),
                     "raw": float(np.mean([not t["format_ok"] for t in judged])),
                     "curt": float(np.mean(["curt" in x for x in thoughts])),
                     "garbage": float(np.mean(["garbage" in x for x in thoughts])),
                     "chars": float(np.mean([len(t["reply"] if t["format_ok"] else t["raw"]) for t in judged])),
                     "ends": dict(sorted(collections.Counter(r["end_reason"] for r in records).items()))})
    return rows


def evaluation_table(rows: list[dict]) -> str:
    head = ("| recipe | step | held-out score | judged turns per dialogue | change per turn | sent raw (no </think>) "
            "| curt | garbage | characters read | ended |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
    body = "".join(
        f"| {r['algo']} | {r['step']} | {r['score']:.1f} | {r['turns']:.1f} | {r['change']:+.2f} | {r['raw']:.0%} | "
        f"{r['curt']:.0%} | {r['garbage']:.0%} | {r['chars']:.0f} | "
        + ", ".join(f"{k} {v}" for k, v in r["ends"].items()) + " |\n" for r in rows)
    return head + body


def main(argv):
    del argv
    unknown = sorted(set(_ALGOS.value) - set(ALGORITHMS))
    if unknown:
        raise app.UsageError(f"--algos: {unknown} are not recipes; choose from {sorted(ALGORITHMS)}")
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    figures = pathlib.Path(_FIGURES.value) if _FIGURES.value else None
    if figures:
        figures.mkdir(parents=True, exist_ok=True)
    rows, evals = [], []
    for algo in _ALGOS.value:
        minutes = train(algo, out)
        rows.append(summarise(algo, out / algo, _WINDOW.value, minutes))
        evals += evaluations(algo, out / algo)
        print(f"{algo}: reward {rows[-1]['reward_first']:.3f} -> {rows[-1]['reward_last']:.3f} "
              f"({minutes:.1f} min)", flush=True)
        if figures:
            shutil.copyfile(out / algo / "reward.png", figures / f"{algo}_think_tiny_reward.png")
    summary = table(rows, _WINDOW.value) + "\n" + evaluation_table(evals)
    (out / "summary.md").write_text(summary)
    print(summary)


if __name__ == "__main__":
    app.run(main)

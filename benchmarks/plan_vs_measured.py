r"""The planner against measured steps on this CPU: each run trains a few steps, then the planner
estimates the same config on this host's figures, measured right after (parallel/host_peaks.py),
and the two are printed side by side with their ratios.

  .venv/bin/python benchmarks/plan_vs_measured.py
  .venv/bin/python benchmarks/plan_vs_measured.py --runs=grpo_think:tiny --steps=4 --repeats=3

A run: `launch/train.py --config=configs/CONFIG.py:PRESET` for --steps steps (no evaluation, no
checkpoint before the last step) in a fresh work directory; measured: the training metrics
speed/rollout_seconds and speed/update_seconds of every step after the first (which compiles),
their median and range. Planned: `train.planner.plan.plan` of the same config (prepare, the
updates, the rollout) with this host's figures measured fresh, in its "lognormal replies" case
with the dialogues' lengths taken from the run's own transcripts (the first prompt, a later turn's
feed and the replies, tokenized by the run's tokenizer; their mean and log-sd): the lengths are the
plan's inputs, so the comparison checks the time model, not the length assumptions. Each run
--repeats times; the load average of each is printed (the host is shared: an idle one is the target).
"""

import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the plan is of this host's CPU

REPO = pathlib.Path(__file__).resolve().parents[1]
_RUNS = flags.DEFINE_list("runs", ["ppo_think:tiny", "grpo_think:tiny", "ppo_nothink:tiny", "grpo_nothink:tiny",
                                   "ppo_nothink:smol"], "CONFIG:PRESET of configs/CONFIG.py to train and plan.")
_STEPS = flags.DEFINE_integer("steps", 4, "Train steps a run (the first, which compiles, is not measured).")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Runs of each config.")
_WORKDIR = flags.DEFINE_string("workdir", "", "Where the runs go (default: a temporary directory).")
_OUT = flags.DEFINE_string("out", "", "Also write the rows as JSON lines here.")


def _train(config: str, preset: str, workdir: pathlib.Path) -> list[dict]:
    """The run's metrics, a line a step."""
    cmd = [sys.executable, str(REPO / "launch" / "train.py"), f"--config=configs/{config}.py:{preset}",
           f"--config.workdir={workdir}", f"--config.train.steps={_STEPS.value}", "--config.train.eval_every=0",
           "--config.checkpoint.save_every=1000", "--config.checkpoint.async_save=False"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _lengths(spec, workdir: pathlib.Path):
    """The plan's length inputs from the run's transcripts of the measured steps (module docstring)."""
    from rlver_jax.text import chat
    from rlver_jax.train.model_loading import tokenizer_for
    from rlver_jax.train.planner.lengths import Lengths

    ct = tokenizer_for(spec.model, workdir, build=False)
    wrap = len(ct.assistant_header) + 1 + len(ct.newline)  # an assistant message's ids around its text's

    def text_tokens(text: str) -> int:
        return len(chat.encode_message(ct, "assistant", text)[0]) - wrap

    prompts, feeds, replies, shown = [], [], [], []
    for path in sorted((workdir / "transcripts").glob("train_*.jsonl"))[1:]:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            messages = record["messages"]
            users = [m for m in messages if m["role"] == "user"]
            prompts.append(sum(len(chat.encode_message(ct, m["role"], m["content"])[0]) for m in messages[:2])
                           + len(ct.assistant_header))
            feeds += [len(chat.encode_message(ct, "user", m["content"])[0]) for m in users[1:]]
            for turn in record["turns"]:  # a turn not stopped ran to its budget (decoded text re-tokenizes otherwise)
                budget = spec.sampling.max_new_tokens
                replies.append(min(budget, max(1, text_tokens(turn["raw"]) + 1)) if turn["stopped"] else budget)
                if spec.rollout.drop_thoughts and turn.get("reply") is not None:
                    shown.append(text_tokens(turn["reply"]) / replies[-1])
    logs = [math.log(r) for r in replies]
    return Lengths(prompt=round(statistics.mean(prompts)), feed=max(1, round(statistics.mean(feeds or [1]))),
                   shown=min(1.0, max(0.01, statistics.mean(shown or [1.0]))), mean_reply=statistics.mean(replies),
                   log_sd=statistics.pstdev(logs))


def _plan(config: str, preset: str, workdir: pathlib.Path):
    import jax

    from configs import base
    from rlver_jax.parallel import host_peaks
    from rlver_jax.train.planner import hlo_cost, plan
    from rlver_jax.train.spec import RunSpec

    jax.config.update("jax_threefry_partitionable", True)
    cfg = __import__(f"configs.{config}", fromlist=["get_config"]).get_config(base.parse_preset(preset))
    cfg.workdir = str(workdir)
    spec = RunSpec.from_config(cfg)
    chip = host_peaks.measure(cfg.model.dtype, lambda c: hlo_cost.program_cost(c).ops, fresh=True)
    lengths = _lengths(spec, workdir)
    phases = ("prepare", "actor update", "critic update", "rollout")
    return plan.plan(spec, None, phases, lengths, search=False, host_chip=chip), lengths, chip


def _row(name: str, metrics: list[dict], result) -> dict:
    measured = {k: [m[k] for m in metrics[1:]] for k in ("rollout_seconds", "update_seconds")}
    case = result.estimate.cases[-1]  # the lognormal case, at the run's own lengths
    planned = {"rollout_seconds": case.rollout_wall, "update_seconds": case.update.seconds}
    row = {"run": name, "load": os.getloadavg()[0]}
    for key, values in measured.items():
        median = statistics.median(values)
        row[key] = {"planned": planned[key], "measured": median, "low": min(values), "high": max(values),
                    "ratio": planned[key] / median if median else float("inf")}
    return row


def main(argv):
    del argv
    root = pathlib.Path(_WORKDIR.value or tempfile.mkdtemp(prefix="plan_vs_measured_"))
    print(f"{'run':<22} {'load':>5}  {'rollout s planned / measured [range]':<40} {'ratio':>6}  "
          f"{'update s planned / measured [range]':<40} {'ratio':>6}", flush=True)
    for repeat in range(_REPEATS.value):
        for run in _RUNS.value:
            config, preset = run.split(":")
            workdir = root / f"{config}_{preset}_{repeat}"
            metrics = _train(config, preset, workdir)
            result, lengths, chip = _plan(config, preset, workdir)
            row = _row(run, metrics, result)
            row.update(lengths=vars(lengths), chip=vars(chip))
            cells = []
            for key in ("rollout_seconds", "update_seconds"):
                c = row[key]
                cells.append(f"{c['planned']:7.2f} / {c['measured']:6.2f} [{c['low']:.2f}-{c['high']:.2f}]"
                             f"{'':<10} {c['ratio']:6.2f}")
            print(f"{run:<22} {row['load']:5.1f}  {cells[0]}  {cells[1]}", flush=True)
            if _OUT.value:
                with open(_OUT.value, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    app.run(main)

r"""Stale rollouts with and without truncated importance sampling on the tiny think preset for its
default 40 steps (issue 41): learning curves side by side. Never in CI: a few minutes a run on an
idle core, 3 runs by default.

  .venv/bin/python benchmarks/staleness_tiny.py --out=/tmp/staleness_tiny
  .venv/bin/python benchmarks/staleness_tiny.py --out=/tmp/staleness_tiny --variants=on_policy,stale2_tis
  # partial rollouts on and off, on dialogues of three policy turns:
  .venv/bin/python benchmarks/staleness_tiny.py --out=/tmp/partial_tiny \
      --variants=stale2_tis_3turns,stale2_tis_3turns_whole

Every run is the project's own command, `launch/train.py --config=configs/grpo_think.py:tiny` and
the variant's flags (VARIANTS below), in OUT/VARIANT, through benchmarks/recipes_tiny.py's `run`
(whose --window and --train_flags apply here too); a rerun resumes or skips finished runs. Then
OUT/summary.md: per variant recipes_tiny's columns (reward of the first and last --window steps,
format failures, entropy, in-loop eval score, minutes), the policy lag and staleness of the
trained tokens (mean and max over the run), the off-policy metrics of the update (the ratio
rho = pi_old / pi_sample before truncation, its mean and max, the share of tokens TIS truncates,
the mean |logp_old - logp_sample|), and the learning curve: reward_mean per --curve_window steps
of each variant side by side (OUT/curve.png too where matplotlib is installed).
"""

import json
import pathlib
import sys

import numpy as np
from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

from benchmarks import recipes_tiny  # noqa: E402  (defines --out, --window, --train_flags; --algos unused here)

# name -> launch/train.py flags on top of configs/grpo_think.py:tiny
VARIANTS = {
    "on_policy": ["--config.rollout.max_staleness=0", "--config.rl.off_policy_correction=none"],
    "stale2_none": ["--config.rollout.max_staleness=2", "--config.rl.off_policy_correction=none"],
    "stale2_tis": ["--config.rollout.max_staleness=2", "--config.rl.off_policy_correction=tis"],
    # Partial rollouts need dialogues of several policy turns (the tiny preset plays one): three,
    # the raw text reaching the user, with in-flight dialogues moving to newer versions or not.
    "stale2_tis_3turns": ["--config.rollout.max_staleness=2", "--config.rl.off_policy_correction=tis",
                          "--config.simulator.max_turns=3", "--config.rollout.format_failure=continue"],
    "stale2_tis_3turns_whole": ["--config.rollout.max_staleness=2", "--config.rl.off_policy_correction=tis",
                                "--config.simulator.max_turns=3", "--config.rollout.format_failure=continue",
                                "--config.rollout.partial_rollouts=False"],
}

flags.FLAGS.set_default("out", "/tmp/staleness_tiny")
_VARIANTS = flags.DEFINE_list("variants", ["on_policy", "stale2_none", "stale2_tis"],
                              "Variants to run (VARIANTS).")
_CURVE = flags.DEFINE_integer("curve_window", 5, "Steps averaged per point of the learning curve.")


def metrics(workdir: pathlib.Path) -> list[dict]:
    """The run's metrics rows, one a step (the last written wins after a resume), by step."""
    rows = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        if line:
            row = json.loads(line)
            rows[row["step"]] = {**rows.get(row["step"], {}), **row}
    return [rows[s] for s in sorted(rows)]


def summarise(name: str, workdir: pathlib.Path, window: int, minutes: float) -> dict:
    """recipes_tiny.summarise's row plus staleness and off-policy metrics over the whole run."""
    rows = metrics(workdir)
    out = recipes_tiny.summarise(name, workdir, window, minutes)

    def over(key, fn):
        values = [r[key] for r in rows if key in r]
        return float(fn(values)) if values else float("nan")

    out.update(lag_mean=over("policy_lag", np.mean), lag_max=over("policy_lag", np.max),
               staleness_mean=over("staleness_mean", np.mean), staleness_max=over("staleness_max", np.max),
               stale_token_frac=over("stale_token_frac", np.max),
               weight_mean=over("offpolicy_weight_mean", np.mean), weight_max=over("offpolicy_weight_max", np.max),
               clipped_mean=over("offpolicy_clipped_frac", np.mean),
               clipped_max=over("offpolicy_clipped_frac", np.max),
               diff_mean=over("logprob_diff_sampler", np.mean), diff_max=over("logprob_diff_sampler", np.max))
    return out


def table(rows: list[dict], window: int) -> str:
    """recipes_tiny's table of the variants."""
    return recipes_tiny.table(rows, window).replace("| recipe |", "| variant |", 1)


def off_policy_table(rows: list[dict]) -> str:
    head = ("| variant | policy_lag mean / max | staleness_mean mean / staleness_max max | stale_token_frac max "
            "| offpolicy_weight_mean mean | offpolicy_weight_max max | offpolicy_clipped_frac mean / max "
            "| logprob_diff_sampler mean / max |\n|---|---|---|---:|---:|---:|---|---|\n")
    body = "".join(
        f"| {r['algo']} | {r['lag_mean']:.2f} / {r['lag_max']:.0f} | {r['staleness_mean']:.2f} / "
        f"{r['staleness_max']:.0f} | {r['stale_token_frac']:.2f} | {r['weight_mean']:.4f} | {r['weight_max']:.3f} | "
        f"{r['clipped_mean']:.3%} / {r['clipped_max']:.3%} | {r['diff_mean']:.4f} / {r['diff_max']:.4f} |\n"
        for r in rows)
    return head + body


def curves(runs: dict[str, list[dict]], size: int) -> tuple[list[int], dict[str, list[float]]]:
    """Window starts and, per variant, the mean reward_mean of each `size`-step window."""
    steps = max(len(rows) for rows in runs.values())
    starts = list(range(0, steps, size))
    return starts, {name: [float(np.mean([r["reward_mean"] for r in rows[s:s + size]])) if rows[s:s + size]
                           else float("nan") for s in starts] for name, rows in runs.items()}


def curve_table(runs: dict[str, list[dict]], size: int) -> str:
    starts, means = curves(runs, size)
    head = "| steps | " + " | ".join(means) + " |\n|---|" + "---:|" * len(means) + "\n"
    return head + "".join(f"| {s}-{s + size - 1} | " + " | ".join(f"{m[i]:.3f}" for m in means.values()) + " |\n"
                          for i, s in enumerate(starts))


def plot(runs: dict[str, list[dict]], size: int, path: pathlib.Path) -> bool:
    """reward_mean per step (thin) and per window (thick) of each variant, to `path`; False
    where matplotlib is not installed (it is no dependency of the project)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    starts, means = curves(runs, size)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for (name, rows), color in zip(runs.items(), ("C0", "C1", "C2", "C3", "C4")):
        ax.plot([r["step"] for r in rows], [r["reward_mean"] for r in rows], color=color, alpha=0.3, lw=0.8)
        ax.plot([s + (size - 1) / 2 for s in starts], means[name], color=color, lw=2, marker="o", ms=3, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("reward_mean")
    ax.set_title(f"tiny GRPO think: reward per step, {size}-step means")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv):
    del argv
    unknown = sorted(set(_VARIANTS.value) - set(VARIANTS))
    if unknown:
        raise app.UsageError(f"--variants: {unknown} are not variants; choose from {sorted(VARIANTS)}")
    out = pathlib.Path(flags.FLAGS.out)
    out.mkdir(parents=True, exist_ok=True)
    window, extra = flags.FLAGS.window, flags.FLAGS.train_flags
    rows, runs = [], {}
    for name in _VARIANTS.value:
        minutes = recipes_tiny.run(name, out, "grpo_think", [*VARIANTS[name], *extra])
        rows.append(summarise(name, out / name, window, minutes))
        runs[name] = metrics(out / name)
        print(f"{name}: reward {rows[-1]['reward_first']:.3f} -> {rows[-1]['reward_last']:.3f} "
              f"({minutes:.1f} min)", flush=True)
    text = (f"{table(rows, window)}\n{off_policy_table(rows)}\nreward_mean per {_CURVE.value} steps:\n\n"
            f"{curve_table(runs, _CURVE.value)}")
    if plot(runs, _CURVE.value, out / "curve.png"):
        text += "\n![reward_mean per step and per window](curve.png)\n"
    (out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    app.run(main)

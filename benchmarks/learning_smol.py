r"""Learning run of the real SmolLM2-135M-Instruct (issues 25, 42): does RL against the embedded
simulator raise the Sentient score on held-out English profiles? Never in CI.

  .venv/bin/python benchmarks/learning_smol.py --out=/tmp/learning_smol                # docs/smol.md's commands
  .venv/bin/python benchmarks/learning_smol.py --out=/tmp/learning_smol --algos=grpo,drgrpo
  .venv/bin/python benchmarks/learning_smol.py --out=/tmp/smol_seeds --seeds=0,1,2    # the 16-dialogue table
  .venv/bin/python benchmarks/learning_smol.py --out=/tmp/smol_power --seeds=0,1,2 --control_seeds=0 \
      --eval_repeats=4 --attack=attack_smol.json --train_flags=--config.train.eval_every=0   # docs/smol.md's
  .venv/bin/python benchmarks/learning_smol.py --out=/tmp/split --protocol=split --algos=grpo,ppo --steps=10

Everything goes through the project's own commands, so the numbers are what a user would get.
--protocol=preset (the default) runs docs/smol.md's commands as written:
  1. `launch/eval.py --config=configs/eval.py:smol` of the untrained model (the 16 English profiles
     the smol training presets hold out, SAGE's rules: initial emotion 40, 10 rounds, the last
     reply unjudged): OUT/eval_base;
  2. per algorithm and --seeds entry `launch/train.py --config=configs/grpo_nothink.py:smol` (PPO: ppo_nothink; any
     other recipe: grpo_nothink with --config.rl.algo=ALGO) with the preset's defaults (--steps
     and --train_flags change them; a seed but 0 is --config.seed=SEED): OUT/RUN, RUN = ALGO (seed 0)
     or ALGO_seedSEED; then the same evaluation of its checkpoint: OUT/eval_RUN; with --eval_repeats=R
     above 1 each held-out profile is played R times (ids PROFILE~r, one mean each), the robustness
     probes by the base evaluation only;
  2b. per --control_seeds entry the random-reward control: the same run with each step's rewards
     permuted among its dialogues (--config.rl.shuffle_rewards=true): OUT/ALGO_shuffled[_seedSEED];
--protocol=split keeps a split of its own (--train_profiles, --eval_profiles, each eval profile
played --eval_repeats times under ids PROFILE~r, one mean each; no in-loop evaluation, one
checkpoint at the end). Then, either way:
  3. `launch/eval.py --compare=OUT/eval_base,OUT/eval_grpo,...` (compare.html: the dialogues side
     by side; with chromium and selenium, OUT/compare/compare_page.png, its first screen) and
     `launch/view.py OUT/ALGO` (the training pages);
  4. OUT/summary.md: each score with a 95% bootstrap interval over profiles, the paired difference
     to the base with its interval (rlver_jax.eval.compare.paired_difference on the per-profile
     means), the shares of degenerate replies (repetition within a reply, a reply repeating the
     previous one), the reward curve of each run's metrics.jsonl with the means of its first and
     last 5 steps, minutes per command, the spread over seeds, each policy's template_rate (replies
     that share a skeleton with another user's), the attack's ceiling (--attack: the JSON of
     launch/attack_simulator.py on the same profiles), the robustness probes' scores (the base
     evaluation's scripted policies, eval/probes.py) and the first judged reply per eval profile.
"""

import collections
import json
import pathlib
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runs from a checkout

from configs.eval import ENGLISH_PROFILES, SMOL_HOLDOUT  # noqa: E402
from rlver_jax.eval.compare import paired_difference  # noqa: E402
from rlver_jax.rl.algorithms import ALGORITHMS  # noqa: E402

_OUT = flags.DEFINE_string("out", "/tmp/learning_smol", "Directory for everything (reruns resume each command).")
_ALGOS = flags.DEFINE_list("algos", ["grpo"], "Recipes (config.rl.algo) to train, each from its no-think smol preset.")
_PROTOCOL = flags.DEFINE_enum("protocol", "preset", ["preset", "split"],
                              "preset: docs/smol.md's commands as written; split: the profiles of --train_profiles "
                              "and --eval_profiles, each eval profile --eval_repeats times.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "config.seed of each training run per recipe (one run per seed).")
_STEPS = flags.DEFINE_integer("steps", 0, "Training steps per run; 0 = the preset's own.")
_TRAIN = flags.DEFINE_list("train_profiles", [f"rlverjax-en-0{i}" for i in range(1, 5)],
                           "Profile ids (of the English profiles) trained on.")
_EVAL = flags.DEFINE_list("eval_profiles", [f"rlverjax-en-0{i}" for i in range(5, 9)],
                          "Held-out profile ids evaluated on; none may be a training profile.")
_REPEATS = flags.DEFINE_integer("eval_repeats", 0, "Dialogues per eval profile (0: 4 with --protocol=split, 1 "
                                "with preset).")
_CONTROL = flags.DEFINE_list("control_seeds", [], "Seeds of the random-reward control per recipe (rewards shuffled "
                             "within each batch).")
_ATTACK = flags.DEFINE_string("attack", None, "launch/attack_simulator.py's JSON on the held-out profiles: its "
                              "ceiling goes in the table.")
_TRAIN_FLAGS = flags.DEFINE_list("train_flags", [], "Extra launch/train.py flags for every run, e.g. "
                                 "--train_flags=--config.optim.actor.lr=2e-5 (commas separate flags).")
_EVAL_FLAGS = flags.DEFINE_list("eval_flags", [], "Extra launch/eval.py flags for every evaluation.")

REPEAT_SEP = "~"  # eval entry ids are PROFILE~r


def write_profiles(out: pathlib.Path, train_ids: Sequence[str], eval_ids: Sequence[str], repeats: int
                   ) -> tuple[pathlib.Path, pathlib.Path]:
    """OUT/train.jsonl and OUT/eval.jsonl (each eval profile `repeats` times) from the English profiles."""
    overlap = set(train_ids) & set(eval_ids)
    if overlap:
        raise app.UsageError(f"profiles both trained and evaluated on: {sorted(overlap)}")
    shipped = {p["id"]: p for p in map(json.loads, ENGLISH_PROFILES.read_text(encoding="utf-8").splitlines())}
    missing = sorted((set(train_ids) | set(eval_ids)) - set(shipped))
    if missing:
        raise app.UsageError(f"not among {ENGLISH_PROFILES}: {missing}")
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = out / "train.jsonl", out / "eval.jsonl"
    train.write_text("".join(json.dumps(shipped[i]) + "\n" for i in train_ids), encoding="utf-8")
    held_out.write_text("".join(json.dumps({**shipped[i], "id": f"{i}{REPEAT_SEP}{r}"}) + "\n"
                                for i in eval_ids for r in range(repeats)), encoding="utf-8")
    return train, held_out


def run(name: str, args: list[str], out: pathlib.Path, minutes: dict[str, float]) -> None:
    """One project command (its output in OUT/NAME.log); records its minutes; stops on failure."""
    t0 = time.time()
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.run([sys.executable, *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    minutes[name] = (time.time() - t0) / 60
    print(f"{name}: {minutes[name]:.1f} min, rc {rc} ({out / f'{name}.log'})", flush=True)
    if rc:
        raise SystemExit(f"{name} failed: see {out / f'{name}.log'}")


def evaluate(name: str, eval_file: pathlib.Path | None, out: pathlib.Path, minutes: dict[str, float],
             checkpoint: pathlib.Path | None = None) -> None:
    """SAGE's rules on the held-out profiles (the preset's, or EVAL_FILE's); the fetched SmolLM2, or a
    run's checkpoint (without the probes, which the base evaluation plays)."""
    policy = [] if checkpoint is None else ["--config.policy.path=", f"--config.policy.checkpoint={checkpoint}",
                                            "--config.eval.probes="]
    split = [] if eval_file is None else [f"--config.eval.profiles={eval_file}", "--config.eval.holdout=0"]
    run(name, ["launch/eval.py", "--config=configs/eval.py:smol", f"--config.workdir={out / name}", *split, *policy,
               *_EVAL_FLAGS.value], out, minutes)


def run_name(algo: str, seed: int, control: bool = False) -> str:
    """A run's directory name: the recipe (with "_shuffled" for the random-reward control), with its
    seed unless 0 (the preset's, and older runs' names)."""
    base = f"{algo}_shuffled" if control else algo
    return base if seed == 0 else f"{base}_seed{seed}"


def repeats() -> int:
    return _REPEATS.value or (4 if _PROTOCOL.value == "split" else 1)


def train(algo: str, seed: int, train_file: pathlib.Path | None, out: pathlib.Path, minutes: dict[str, float],
          control: bool = False) -> None:
    """The recipe's smol run: the preset's defaults (with --steps and --train_flags); with a split of
    our own, on TRAIN_FILE only, without in-loop evaluation (launch/eval.py's is the held-out one)
    and with one checkpoint at the end; `control`: the random-reward control."""
    preset = "ppo_nothink" if algo == "ppo" else "grpo_nothink"
    name = run_name(algo, seed, control)
    args = ["launch/train.py", f"--config=configs/{preset}.py:smol", f"--config.workdir={out / name}",
            f"--config.rl.algo={algo}"] + (["--config.rl.shuffle_rewards=true"] if control else [])
    if seed:
        args.append(f"--config.seed={seed}")
    if _STEPS.value:
        args.append(f"--config.train.steps={_STEPS.value}")
    if train_file is not None:
        args += [f"--config.data.train_profiles={train_file}", "--config.data.eval_holdout=0",
                 "--config.train.eval_every=0", f"--config.checkpoint.save_every={_STEPS.value}"]
    run(name, args + _TRAIN_FLAGS.value, out, minutes)


def profile_means(eval_dir: pathlib.Path) -> dict[str, float]:
    """Mean final emotion per held-out profile (over its repeats), simulator errors left out."""
    finals: dict[str, list[float]] = {}
    for p in json.loads((eval_dir / "sentient.json").read_text())["per_profile"]:
        if p["end_reason"] != "simulator_error":
            finals.setdefault(p["id"].split(REPEAT_SEP)[0], []).append(p["final_emotion"])
    return {pid: float(np.mean(v)) for pid, v in finals.items()}


def interval(values: np.ndarray) -> tuple[float, float, float]:
    """Mean and 95% bootstrap interval over profiles: compare's paired bootstrap against zeros."""
    d = paired_difference(np.zeros_like(values), values)
    return d["mean_diff"], *d["ci95"]


def _paired(base: np.ndarray, other: np.ndarray) -> str:
    d = paired_difference(base, other)
    return f"{d['mean_diff']:+.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]"


def reward_curve(run_dir: pathlib.Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: r.get(k) for k in ("step", "reward_mean", "emotion_mean", "eval_score", "rollout_seconds",
                                   "update_seconds")} for r in rows]


def first_turns(eval_dir: pathlib.Path) -> dict[str, dict[str, Any]]:
    """The first dialogue of each held-out profile: its opening user line and first judged reply."""
    out = {}
    for line in (eval_dir / "transcripts.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        pid, _, repeat = r["profile_id"].partition(REPEAT_SEP)
        if repeat in ("", "0") and r["turns"]:
            user = next(m["content"] for m in r["messages"] if m["role"] == "user")
            out[pid] = {"user": user, **{k: r["turns"][0].get(k) for k in ("reply", "change", "simulator_thoughts")}}
    return out


def score_table(out: pathlib.Path, names: Sequence[str], minutes: dict[str, float]) -> list[str]:
    """Each policy's score over the profiles every evaluation scored, and its difference to the base."""
    means = {name: profile_means(out / f"eval_{name}") for name in names}
    common = sorted(set.intersection(*(set(m) for m in means.values())))
    base = np.array([means["base"][p] for p in common])
    steps = _STEPS.value or "the preset's"
    lines = [f"{len(common)} held-out profiles x {repeats()} dialogue(s), {steps} training "
             "steps; degenerate: the shares of judged replies that repeat themselves within the reply and that "
             "repeat the previous reply (sentient.json)\n",
             "| policy | score (95% CI over profiles) | vs base (paired, 95% CI) | better / equal / worse "
             "| degenerate: repetition, repeated turn | template_rate | minutes (train + eval) |",
             "|---|---|---|---|---|---:|---:|"]
    for name in names:
        values = np.array([means[name][p] for p in common])
        mean, lo, hi = interval(values)
        diff = "-" if name == "base" else _paired(base, values)
        counts = "-" if name == "base" else "{} / {} / {}".format(
            int((values > base).sum()), int((values == base).sum()), int((values < base).sum()))
        sentient = json.loads((out / f"eval_{name}" / "sentient.json").read_text())
        degenerate = sentient["degenerate_replies"]
        rates = f"{degenerate['degenerate_repetition_rate']:.0%}, {degenerate['degenerate_repeat_turn_rate']:.0%}"
        spent = minutes.get(name, 0.0) + minutes.get(f"eval_{name}", 0.0)
        lines.append(f"| {name} | {mean:.1f} [{lo:.1f}, {hi:.1f}] | {diff} | {counts} | {rates} "
                     f"| {sentient.get('template_rate', float('nan')):.2f} | {spent:.1f} |")
    if _ATTACK.value:
        attack = json.loads(pathlib.Path(_ATTACK.value).read_text())
        lines.append(f"| the attack's best template ({attack['best']}, {attack['played']} dialogues searched) "
                     f"| {attack['best_score']:.1f} | | | | 1.00 | {attack['cpu_seconds'] / 60:.1f} (CPU) |")
    return lines


def reward_table(run_dir: pathlib.Path, window: int = 5) -> list[str]:
    curve = reward_curve(run_dir)
    first, last = (np.mean([r["reward_mean"] for r in part]) for part in (curve[:window], curve[-window:]))
    return [f"Mean reward, first {window} steps {first:.3f}, last {window} {last:.3f}\n",
            "| step | reward | emotion | held-out score | rollout s | update s |",
            "|---:|---:|---:|---:|---:|---:|"] + [
        f"| {r['step']} | {r['reward_mean']:.3f} | {r['emotion_mean']:.1f} | "
        + (f"{r['eval_score']:.1f}" if r.get("eval_score") is not None else "")
        + f" | {r['rollout_seconds']:.0f} | {r['update_seconds']:.0f} |" for r in curve]


def excerpts(out: pathlib.Path, names: Sequence[str]) -> list[str]:
    """Per held-out profile: the user's opening line, then each policy's first reply and its judgement."""
    turns = {name: first_turns(out / f"eval_{name}") for name in names}
    lines = []
    for pid, base in sorted(turns["base"].items()):
        lines.append(f"**{pid}** user: {base['user']}\n")
        lines += [f"- {name} ({t[pid]['change']:+d}): {t[pid]['reply']!r} [{t[pid]['simulator_thoughts']}]"
                  for name, t in turns.items() if pid in t]
        lines.append("")
    return lines


def variety(eval_dir: pathlib.Path) -> dict[str, Any]:
    """How alike an evaluation's judged replies are beyond the degenerate-reply detectors: the share
    that open with the same 4 words as the dialogue's previous reply, the most common 4-word opening
    and its share of all replies, and distinct-2 (distinct word bigrams / bigrams, over all replies)."""
    dialogues = [[t["reply"] for t in json.loads(line)["turns"] if "change" in t]
                 for line in (eval_dir / "transcripts.jsonl").read_text(encoding="utf-8").splitlines()]
    opening = [[" ".join(r.lower().split()[:4]) for r in d] for d in dialogues]
    pairs = [a == b for o in opening for a, b in zip(o, o[1:])]
    common, count = collections.Counter(o for d in opening for o in d).most_common(1)[0]
    words = [w for d in dialogues for r in d for w in re.findall(r"[a-z']+", r.lower())]
    bigrams = list(zip(words, words[1:]))
    return {"same_opening": float(np.mean(pairs)), "opening": common, "opening_share": count / sum(map(len, opening)),
            "distinct_2": len(set(bigrams)) / len(bigrams)}


def variety_table(out: pathlib.Path, names: Sequence[str]) -> list[str]:
    lines = ["| policy | opens like its previous reply | most common opening (share of replies) | distinct-2 |",
             "|---|---:|---|---:|"]
    for name in names:
        v = variety(out / f"eval_{name}")
        lines.append(f"| {name} | {v['same_opening']:.0%} | \"{v['opening']}\" ({v['opening_share']:.0%}) "
                     f"| {v['distinct_2']:.2f} |")
    return lines


def seed_spread(out: pathlib.Path, runs: Sequence[str]) -> list[str]:
    """Per recipe with several seeds: the mean and standard deviation over seeds of the held-out score
    and of the paired difference to the base (each seed's interval is in the table above)."""
    by_algo: dict[str, list[str]] = {}
    for name in runs:
        by_algo.setdefault(name.split("_seed")[0], []).append(name)
    base = profile_means(out / "eval_base")
    lines = []
    for algo, names in by_algo.items():
        if len(names) < 2:
            continue
        scores, diffs = [], []
        for name in names:
            means = profile_means(out / f"eval_{name}")
            common = sorted(set(means) & set(base))
            scores.append(np.mean([means[p] for p in common]))
            diffs.append(np.mean([means[p] - base[p] for p in common]))
        lines.append(f"- {algo} over {len(names)} seeds: score {np.mean(scores):.1f} (sd {np.std(scores, ddof=1):.1f}, "
                     f"{min(scores):.1f} to {max(scores):.1f}); vs base {np.mean(diffs):+.1f} "
                     f"(sd {np.std(diffs, ddof=1):.1f}, {min(diffs):+.1f} to {max(diffs):+.1f})")
    return lines


def probe_table(eval_dir: pathlib.Path) -> list[str]:
    """The robustness probes' scores from an evaluation's sentient.json (scripts that never read the
    user, played on the same profiles under the same rules)."""
    probes = json.loads((eval_dir / "sentient.json").read_text()).get("probes") or {}
    return ["| script (ignores the user) | score | rewarded |", "|---|---:|---|"] + [
        f"| {name} | {p['score']:.1f} | {'yes' if p['rewarded'] else 'no'} |" for name, p in probes.items()]


def summary(out: pathlib.Path, runs: Sequence[str], minutes: dict[str, float]) -> str:
    names = ["base", *runs]
    lines = ["# SmolLM2 learning run\n", *score_table(out, names, minutes), "", *seed_spread(out, runs),
             "\n## The robustness probes on the same profiles (eval_base)\n", *probe_table(out / "eval_base"),
             "\n## How alike the replies are (held-out evaluations, judged replies)\n", *variety_table(out, names)]
    for name in runs:
        lines += [f"\n## {name}: reward per step (metrics.jsonl)\n", *reward_table(out / name)]
    lines += ["\n## First judged reply per held-out profile\n", *excerpts(out, names)]
    lines.append(f"\nTotal {sum(minutes.values()):.1f} min: " + ", ".join(f"{k} {v:.1f}" for k, v in minutes.items()))
    return "\n".join(lines) + "\n"


def screenshot(page: pathlib.Path, png: pathlib.Path) -> str:
    """The first screen of `page` in headless chromium (selenium, the test extra); why not, if not."""
    try:
        from selenium import webdriver
        options = webdriver.ChromeOptions()
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
            options.add_argument(arg)
        # The system's driver (Debian's chromium-driver) where there is one: Selenium Manager would go online.
        service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
        driver = webdriver.Chrome(service=service, options=options)
    except Exception as e:  # noqa: BLE001 - a picture is optional: say why there is none
        return f"no screenshot ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    try:
        driver.get(page.as_uri())
        driver.save_screenshot(str(png))
    finally:
        driver.quit()
    return str(png)


def main(argv):
    del argv
    unknown = sorted(set(_ALGOS.value) - set(ALGORITHMS))
    if unknown:
        raise app.UsageError(f"--algos: {unknown} are not recipes; choose from {sorted(ALGORITHMS)}")
    out = pathlib.Path(_OUT.value).resolve()
    train_file = eval_file = None
    if _PROTOCOL.value == "split":
        if not _STEPS.value:
            raise app.UsageError("--protocol=split needs --steps (its runs keep one checkpoint, at the end)")
        train_file, eval_file = write_profiles(out, _TRAIN.value, _EVAL.value, repeats())
    elif repeats() > 1:  # the preset's held-out profiles, each played repeats() times
        held_out = [json.loads(line)["id"] for line in ENGLISH_PROFILES.read_text(encoding="utf-8").splitlines()]
        _, eval_file = write_profiles(out, [], held_out[-SMOL_HOLDOUT:], repeats())
    out.mkdir(parents=True, exist_ok=True)
    minutes: dict[str, float] = {}
    evaluate("eval_base", eval_file, out, minutes)
    try:
        seeds = [int(s) for s in _SEEDS.value]
        controls = [int(s) for s in _CONTROL.value]
    except ValueError:
        raise app.UsageError(f"--seeds, --control_seeds: {_SEEDS.value}, {_CONTROL.value} are not integers, "
                             "e.g. --seeds=0,1,2") from None
    planned = [(algo, seed, control) for algo in _ALGOS.value for control, chosen in ((False, seeds), (True, controls))
               for seed in chosen]
    runs = [run_name(*plan) for plan in planned]
    for algo, seed, control in planned:
        name = run_name(algo, seed, control)
        train(algo, seed, train_file, out, minutes, control)
        evaluate(f"eval_{name}", eval_file, out, minutes, checkpoint=out / name)
        run(f"view_{name}", ["launch/view.py", str(out / name)], out, minutes)
    evals = ",".join(str(out / f"eval_{name}") for name in ["base", *runs])
    run("compare", ["launch/eval.py", f"--compare={evals}", f"--out={out / 'compare'}"], out, minutes)
    picture = screenshot(out / "compare" / "compare.html", out / "compare" / "compare_page.png")
    text = summary(out, runs, minutes) + f"\ncompare page: {picture}\n"
    (out / "summary.md").write_text(text, encoding="utf-8")
    print(text + f"\npages: {out / 'compare' / 'compare.html'}, "
          + ", ".join(str(out / name / "view" / "index.html") for name in runs))


if __name__ == "__main__":
    app.run(main)

"""Evaluation runs side by side, paired per profile: `launch/eval.py --compare=DIR_A,DIR_B --out=DIR`.

Every run's sentient.json is read; the comparison uses the profiles every run scored (simulator
errors and profiles missing from a run are left out and counted). The first run is the baseline:
for each other run, the mean paired difference in final emotion with a 95% bootstrap interval
(resampling profiles), and the profiles it did better, equal and worse on.

Before any score, the runs' protocol cards (eval/protocol.py) are set side by side: every field
that differs is named in every output, and one that moves scores (the simulator and its
sampling, the rules, the profiles, the prompts) refuses the comparison (ProtocolMismatchError)
unless `force`, which marks the comparison "mixed" in every output. When every run is a panel
of the same simulators (eval/panel.py), `rank_agreement` says whether the simulators rank the
runs alike.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlver_jax import plots
from rlver_jax.checks import InputError
from rlver_jax.eval import html_report, protocol
from rlver_jax.eval.capabilities import report as capability_report
from rlver_jax.eval.report import json_text, table
from rlver_jax.files import atomic_write_text

BOOTSTRAP_SAMPLES = 2000


def _load(directory: pathlib.Path) -> dict[str, Any]:
    path = directory / "sentient.json"
    if not path.exists():
        raise FileNotFoundError(f"--compare: {path} not found; evaluate into {directory} first "
                                "(launch/eval.py --config.workdir=...)")
    return json.loads(path.read_text(encoding="utf-8"))


class ProtocolMismatchError(InputError):
    """Runs played under protocols whose scores are not comparable, and no `force`."""


def run_labels(dirs: Sequence[pathlib.Path]) -> list[str]:
    """Directory names, or the whole paths when two names are the same."""
    names = [d.name for d in dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in dirs]


def mean_interval(values: np.ndarray, seed: int = 0) -> list[float]:
    """The 95% bootstrap interval of the mean of `values` (resampling them); nan over none."""
    if not len(values):
        return [float("nan")] * 2
    idx = np.random.default_rng(seed).integers(0, len(values), (BOOTSTRAP_SAMPLES, len(values)))
    lo, hi = np.percentile(values[idx].mean(axis=1), [2.5, 97.5])
    return [float(lo), float(hi)]


def paired_difference(base: np.ndarray, other: np.ndarray, seed: int = 0) -> dict[str, Any]:
    """Mean of other - base over profiles, its 95% bootstrap interval, and wins/ties/losses."""
    diff = other - base
    if not len(diff):
        return {"mean_diff": float("nan"), "ci95": [float("nan")] * 2, "wins": 0, "ties": 0, "losses": 0}
    return {"mean_diff": float(diff.mean()), "ci95": mean_interval(diff, seed), "wins": int((diff > 0).sum()),
            "ties": int((diff == 0).sum()), "losses": int((diff < 0).sum())}


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-a of two scorings of the same items: (concordant - discordant pairs) / all
    pairs; 1 when they rank every pair alike, -1 when opposite, nan under two items."""
    n = len(x)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    if not pairs:
        return float("nan")
    return sum(float(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j])) for i, j in pairs) / len(pairs)


def rank_agreement(runs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """For panel results (eval/panel.py) of several policies (`runs`: run label -> sentient.json, every one a panel
    of the same simulators), Kendall's tau between each two simulators' scores of the policies:
    whether the simulators rank the policies alike. [] unless every run is such a panel."""
    panels = [r.get("panel") for r in runs.values()]
    if len(panels) < 2 or not all(panels) or any(set(p) != set(panels[0]) for p in panels):
        return []
    members = list(panels[0])
    scores = {m: [p[m]["score"] for p in panels] for m in members}
    return [{"simulators": [a, b], "kendall_tau": kendall_tau(scores[a], scores[b])}
            for i, a in enumerate(members) for b in members[i + 1:]]


def capability_scores(dirs: Sequence[str | pathlib.Path], runs: int) -> list[dict[str, float | None]]:
    """The headline capability scores (capabilities.report.HEADLINE: fractions) of each of `dirs`,
    launch/capabilities.py work directories, one per compared run (`runs` of them)."""
    if len(dirs) != runs:
        raise InputError(f"--capabilities names {len(dirs)} directories for {runs} runs: give one "
                         "launch/capabilities.py work directory per run of --compare, in the same order")
    out = []
    for d in map(pathlib.Path, dirs):
        path = d / capability_report.SCORES
        if not path.is_file():
            raise InputError(f"--capabilities: {d} holds no {capability_report.SCORES}; launch/capabilities.py "
                             f"--config.workdir={d} writes it")
        scores = json.loads(path.read_text())
        out.append({b: scores.get(b, {}).get(metric) for b, metric in capability_report.HEADLINE.items()})
    return out


def compare_runs(dirs: Sequence[str | pathlib.Path], out: str | pathlib.Path, *, force: bool = False,
                 capabilities: Sequence[str | pathlib.Path] = ()) -> dict[str, Any]:
    """Write compare.json, compare.md, compare.png and compare.html (the paired dialogues side by
    side) into `out`; returns the comparison. ProtocolMismatchError, before anything is written,
    when a field that moves scores differs between the runs and not `force`. `capabilities`: one
    capability run per evaluation run, whose headline scores join the Sentient score in one table
    (the paper's main table: empathy and what training kept)."""
    dirs = [pathlib.Path(d) for d in dirs]
    if len(dirs) < 2:
        raise InputError(f"--compare needs two or more run directories separated by commas, got "
                         f"{', '.join(map(str, dirs)) or 'none'}")
    retained = capability_scores(capabilities, len(dirs)) if capabilities else None
    labels = run_labels(dirs)
    loaded = {label: _load(d) for label, d in zip(labels, dirs)}
    diff = protocol.differences({label: r.get("protocol") or {} for label, r in loaded.items()})
    moving = protocol.score_moving(diff)
    if moving and not force:
        raise ProtocolMismatchError(
            f"the runs were played under different protocols: {protocol.describe(diff, moving)}. Their scores are "
            "not comparable; rerun one under the other's settings, or add --force to compare them anyway "
            "(the comparison is then marked MIXED)")
    runs = {label: {p["id"]: p for p in r["per_profile"]} for label, r in loaded.items()}
    base = labels[0]
    common = [pid for pid in runs[base]
              if all(pid in r and r[pid]["end_reason"] != "simulator_error" for r in runs.values())]
    finals = {label: np.array([runs[label][pid]["final_emotion"] for pid in common], dtype=float)
              for label in labels}
    result: dict[str, Any] = {"baseline": base, "paired_profiles": len(common), "mixed": bool(moving),
                              "protocol_differences": diff, "score_moving_differences": moving, "runs": {}}
    for label, d in zip(labels, dirs):
        ends = [runs[label][pid]["end_reason"] for pid in common]
        entry = {"dir": str(d), "unpaired_profiles": len(runs[label]) - len(common),
                 "score": float(finals[label].mean()) if common else float("nan"),
                 "success": ends.count("success"), "failure": ends.count("failure")}
        if label != base:
            entry["vs_baseline"] = paired_difference(finals[base], finals[label])
        result["runs"][label] = entry
    result["per_profile"] = [{"id": pid, **{label: float(finals[label][i]) for label in labels}}
                             for i, pid in enumerate(common)]
    result["rank_agreement"] = rank_agreement(loaded)
    if retained is not None:
        result["capabilities"] = dict(zip(labels, retained))
    out = pathlib.Path(out)
    atomic_write_text(out / "compare.json", json_text(result))
    plots.paired_scatter(base, {label: finals[label].tolist() for label in labels}, out / "compare.png")
    atomic_write_text(out / "compare.md", render(result))
    html_report.write_compare_report(out, result)
    return result


def _rank_agreement(rows: list[dict[str, Any]]) -> str:
    """compare.md's section on panels: whether the simulators rank the runs alike."""
    if not rows:
        return ""
    return ("\n## Do the simulators rank the runs alike?\n\nKendall's tau between two simulators' scores of the "
            "runs (1: the same order, -1: the opposite).\n\n"
            + table(["simulator", "simulator", "Kendall's tau"],
                    [[r["simulators"][0], r["simulators"][1], r["kendall_tau"]] for r in rows]))


def _main_table(result: dict[str, Any]) -> str:
    """compare.md's table of empathy beside retention: each run's Sentient score and its capability
    scores (percent), as the paper's main table puts them."""
    caps = result.get("capabilities")
    if not caps:
        return ""
    benches = list(capability_report.HEADLINE)
    rows = [[label, r["score"], *((None if caps[label][b] is None else 100 * caps[label][b]) for b in benches)]
            for label, r in result["runs"].items()]
    return ("\n## Empathy and retention\n\nThe Sentient score beside the capability scores (percent: MATH500 "
            "accuracy, IFEval prompt-level strict accuracy, LiveCodeBench pass@1).\n\n"
            + table(["run", "Sentient score", *(capability_report.NAMES[b] for b in benches)], rows))


def render(result: dict[str, Any]) -> str:
    base = result["baseline"]
    rows = []
    for label, r in result["runs"].items():
        v = r.get("vs_baseline")
        rows.append([label, r["score"], r["success"], r["failure"], r["unpaired_profiles"],
                     None if v is None else v["mean_diff"],
                     None if v is None else f"[{v['ci95'][0]:.1f}, {v['ci95'][1]:.1f}]",
                     None if v is None else f"{v['wins']} / {v['ties']} / {v['losses']}"])
    labels = list(result["runs"])
    others = labels[1:]
    diff = result["protocol_differences"]
    warning = (f"> **MIXED: the runs were played under different protocols** "
               f"({protocol.describe(diff, result['score_moving_differences'])}); "
               "their scores are not comparable.\n\n" if result["mixed"] else "")
    protocol_rows = [[k, *(protocol.shown(v.get(label)) for label in labels)] for k, v in diff.items()]
    return "".join([
        f"# Sentient benchmark: paired comparison against {base}{' (MIXED protocols)' if result['mixed'] else ''}\n\n",
        warning,
        f"{result['paired_profiles']} profiles scored in every run; scores below are over these.\n\n",
        table(["run", "score", "success", "failure", "unpaired", f"mean diff vs {base}", "95% CI",
               "better / equal / worse"], rows),
        _main_table(result),
        _rank_agreement(result.get("rank_agreement") or []),
        "\n## Protocol differences\n\n",
        table(["field", *labels], protocol_rows) if protocol_rows else "none: one protocol\n",
        "\n![paired final emotions](compare.png)\n\n## Per profile (final emotion)\n\n",
        table(["profile", *labels, *(f"{o} - {base}" for o in others)],
              [[p["id"], *(p[label] for label in labels), *(p[o] - p[base] for o in others)]
               for p in result["per_profile"]]),
    ])

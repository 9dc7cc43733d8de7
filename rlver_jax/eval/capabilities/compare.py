"""Base against trained (`--config.compare_to=BASE_WORKDIR`): per benchmark, both scores over
the items both runs graded, the difference (trained minus base) with a paired bootstrap 95%
interval (items resampled with replacement, both sides together), the items that flipped each
way, and the paper's base/PPO figures as a reference column (its settings are unpublished, so
they are not comparable digit for digit). Written to WORKDIR/compare_capabilities.json and .md.

Per item, the headline metric's unit: MATH500 right or wrong, IFEval strict prompt-level
following, LiveCodeBench all tests passed (pass@1 of one greedy sample)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from rlver_jax.eval.capabilities.report import HEADLINE, ITEMS, NAMES
from rlver_jax.eval.resume import load_records
from rlver_jax.files import atomic_write_text

COMPARE_JSON = "compare_capabilities.json"
COMPARE_MD = "compare_capabilities.md"
# RLVER paper (Qwen2.5-7B-Instruct base, PPO think-trained policy), percent; settings unpublished.
PAPER = {"math500": {"base": 77.8, "ppo": 76.6}, "livecodebench": {"base": 26.7, "ppo": 28.0},
         "ifeval": {"base": 70.4, "ppo": 68.6}}
BOOTSTRAP = 10_000


def paired_bootstrap(base: np.ndarray, trained: np.ndarray, *, seed: int = 0, samples: int = BOOTSTRAP
                     ) -> tuple[float, float]:
    """95% percentile interval of mean(trained) - mean(base) over item resamples."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(base), size=(samples, len(base)))
    diffs = trained[idx].mean(axis=1) - base[idx].mean(axis=1)
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(low), float(high)


def compare(base_records: list[dict[str, Any]], trained_records: list[dict[str, Any]], *, seed: int = 0
            ) -> dict[str, Any]:
    base = {r["key"]: r for r in base_records}
    out: dict[str, Any] = {}
    for bench in HEADLINE:
        pairs = [(base[r["key"]], r) for r in trained_records if r["benchmark"] == bench and r["key"] in base]
        if not pairs:
            continue
        b = np.array([bool(p[0]["correct"]) for p in pairs], float)
        t = np.array([bool(p[1]["correct"]) for p in pairs], float)
        low, high = paired_bootstrap(b, t, seed=seed)
        out[bench] = {
            "metric": HEADLINE[bench], "paired_items": len(pairs),
            "base": float(b.mean()), "trained": float(t.mean()),
            "difference": float(t.mean() - b.mean()), "ci95": [low, high],
            "gained": [p[1]["id"] for p in pairs if p[1]["correct"] and not p[0]["correct"]],
            "lost": [p[1]["id"] for p in pairs if p[0]["correct"] and not p[1]["correct"]],
            "paper_percent": {**PAPER[bench], "note": "settings unpublished"}}
    return out


def markdown(result: dict[str, Any], base_dir: pathlib.Path, trained_dir: pathlib.Path) -> str:
    lines = [f"# Capabilities: {trained_dir} against {base_dir}", "",
             "Paired over the items both runs graded; difference = trained - base, 95% paired bootstrap interval "
             f"({BOOTSTRAP} resamples). Paper: RLVER's Qwen2.5-7B-Instruct base and PPO policy, settings "
             "unpublished.",
             "", "| benchmark | metric | n | base (%) | trained (%) | difference (points) | 95% CI | gained | lost "
             "| paper base / PPO (%, settings unpublished) |", "|---|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for bench, r in result.items():
        lo, hi = r["ci95"]
        paper = r["paper_percent"]
        lines.append(f"| {NAMES[bench]} | {r['metric']} | {r['paired_items']} | {100 * r['base']:.1f} | "
                     f"{100 * r['trained']:.1f} | {100 * r['difference']:+.1f} | "
                     f"[{100 * lo:+.1f}, {100 * hi:+.1f}] | {len(r['gained'])} | {len(r['lost'])} | "
                     f"{paper['base']} / {paper['ppo']} |")
    for bench, r in result.items():
        for way, meaning in (("gained", "wrong in the base, right trained"),
                             ("lost", "right in the base, wrong trained")):
            if r[way]:
                lines += ["", f"{NAMES[bench]} {way} ({meaning}): " + ", ".join(r[way])]
    return "\n".join(lines) + "\n"


def write_comparison(base_dir: pathlib.Path, trained_dir: pathlib.Path, *, seed: int = 0) -> dict[str, Any]:
    base_records = load_records(base_dir / ITEMS)
    if not base_records:
        raise FileNotFoundError(f"config.compare_to={str(base_dir)!r}: no graded items in {base_dir / ITEMS}; give "
                                "the WORKDIR of a finished launch/capabilities.py run of the base model")
    result = compare(base_records, load_records(trained_dir / ITEMS), seed=seed)
    if not result:
        raise ValueError(f"config.compare_to={str(base_dir)!r}: no item in common with {trained_dir}; run both on "
                         "the same data")
    payload = {"base": str(base_dir), "trained": str(trained_dir), "benchmarks": result}
    atomic_write_text(trained_dir / COMPARE_JSON, json.dumps(payload, indent=2) + "\n")
    atomic_write_text(trained_dir / COMPARE_MD, markdown(result, base_dir, trained_dir))
    return payload

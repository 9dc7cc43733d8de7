"""Judge the dialogues of evaluation runs and tabulate capabilities and strategies per model
(launch/analyze.py).

Reads each run's transcripts.jsonl (dialogues the simulator failed on are skipped), asks the judge
about every dialogue concurrently, and appends each judgement to OUT/judgements.jsonl as it
arrives: a rerun skips the dialogues already judged. Writes OUT/analysis.json, analysis.md,
capabilities.png (radar, one polygon per model) and strategies.png (bars per model).
"""

from __future__ import annotations

import asyncio
import pathlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from rlver_jax import plots
from rlver_jax.eval.compare import run_labels
from rlver_jax.eval.llm_judge import CAPABILITIES, OTHER, STRATEGIES, Judge, JudgeSettings
from rlver_jax.eval.report import json_text, table
from rlver_jax.eval.resume import check_setup, load_records
from rlver_jax.files import append_jsonl, atomic_write_text, read_jsonl
from rlver_jax.llm_client import EndpointUnavailableError, check_chat_endpoint, restated

JUDGEMENTS = "judgements.jsonl"
STRATEGY_LABELS = (*STRATEGIES, OTHER)


def _dialogues(directory: pathlib.Path, limit: int) -> list[dict[str, Any]]:
    path = directory / "transcripts.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"--runs: {path} not found; evaluate into {directory} first "
                                "(launch/eval.py --config.workdir=...)")
    dialogues = [t for t in read_jsonl(path) if not t["simulator_error"]]
    return dialogues[:limit] if limit else dialogues


def summarize_judgements(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean rating per capability (and their mean), and strategy uses per policy reply."""
    ok = [r for r in records if r["error"] is None]
    means = {k: sum(r["scores"][k] for r in ok) / len(ok) if ok else float("nan") for k in CAPABILITIES}
    uses: Counter = Counter()
    for r in ok:
        uses.update(r["strategies"])
    replies = sum(r["replies"] for r in ok)
    return {"judged": len(ok), "judge_errors": len(records) - len(ok), "scores": means,
            "overall": sum(means.values()) / len(means), "replies": replies,
            "strategy_rates": {k: uses[k] / replies if replies else 0.0 for k in STRATEGY_LABELS}}


def analyze(run_dirs: Sequence[str | pathlib.Path], out: str | pathlib.Path, settings: JudgeSettings, *,
            max_dialogues: int = 0, progress: bool = True) -> dict[str, Any]:
    """Judge every dialogue of `run_dirs` (or the first `max_dialogues` of each); returns the
    summary written to analysis.json."""
    dirs = [pathlib.Path(d).resolve() for d in run_dirs]
    if not dirs:
        raise ValueError("--runs is empty: give evaluation directories separated by commas")
    labels = run_labels(dirs)
    dialogues = {d: _dialogues(d, max_dialogues) for d in dirs}
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / JUDGEMENTS
    check_setup(out / "setup.json", {"judge.model": settings.model, "judge.temperature": settings.temperature,
                                     "judge.max_tokens": settings.max_tokens}, path)
    done = {(r["dir"], r["profile_id"]) for r in load_records(path)}
    pending = [(d, t) for d in dirs for t in dialogues[d] if (str(d), t["profile_id"]) not in done]
    if pending:
        check_chat_endpoint(settings.client)
        bar = tqdm(total=len(pending), disable=not progress, desc="judge", unit="dialogue", dynamic_ncols=True)

        async def run():
            judge = Judge(settings)

            async def one(d, t):
                record = await judge.rate(t)
                append_jsonl(path, {"dir": str(d), "profile_id": t["profile_id"], **record})
                bar.update(1)

            try:
                await asyncio.gather(*(one(d, t) for d, t in pending))
            finally:
                await judge.aclose()

        try:
            asyncio.run(run())
        except EndpointUnavailableError as e:
            raise restated(e, f"{e}\nThe judgements so far are saved in {path}; rerun the same command to "
                              "resume") from e
        finally:
            bar.close()
    wanted = {(str(d), t["profile_id"]) for d in dirs for t in dialogues[d]}
    records = [r for r in load_records(path) if (r["dir"], r["profile_id"]) in wanted]
    summary = {"judge": settings.model,
               "models": {label: {"dir": str(d), **summarize_judgements([r for r in records if r["dir"] == str(d)])}
                          for label, d in zip(labels, dirs)}}
    _write(out, summary)
    return summary


def _write(out: pathlib.Path, summary: dict[str, Any]) -> None:
    models = summary["models"]
    atomic_write_text(out / "analysis.json", json_text(summary))
    plots.capability_radar([CAPABILITIES[k][0] for k in CAPABILITIES],
                           {m: [s["scores"][k] for k in CAPABILITIES] for m, s in models.items()},
                           out / "capabilities.png")
    plots.strategy_bars(list(STRATEGY_LABELS), {m: [s["strategy_rates"][k] for k in STRATEGY_LABELS]
                                                for m, s in models.items()}, out / "strategies.png")
    atomic_write_text(out / "analysis.md", "".join([
        f"# Dialogue capabilities (LLM judge: {summary['judge']}; 1 to 5)\n\n",
        table(["model", "judged", "judge errors", *(CAPABILITIES[k][0] for k in CAPABILITIES), "mean"],
              [[m, s["judged"], s["judge_errors"], *(s["scores"][k] for k in CAPABILITIES), s["overall"]]
               for m, s in models.items()]),
        "\n![capabilities](capabilities.png)\n\n## Response strategies (uses per policy reply)\n\n",
        table(["model", "replies", *STRATEGY_LABELS],
              [[m, s["replies"], *(f"{s['strategy_rates'][k]:.2f}" for k in STRATEGY_LABELS)]
               for m, s in models.items()]),
        "\n![strategies](strategies.png)\n",
    ]))

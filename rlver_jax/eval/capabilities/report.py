"""A capability run's outputs: WORKDIR/capabilities.json (per benchmark `n` and its metrics:
math500.accuracy; ifeval.prompt_level_strict_acc, instruction_level_strict_acc and the loose
pair; livecodebench.pass@1; all fractions in [0, 1]), report.md and capabilities.html (every
item's question, answer and grade, filtered by benchmark and right/wrong), all from the per-item
verdicts of WORKDIR/items.jsonl (ITEMS: written by runner, read here and by compare)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

from rlver_jax.eval import protocol
from rlver_jax.files import atomic_write_text

ITEMS = "items.jsonl"  # the graded items, one record each
SCORES = "capabilities.json"
REPORT = "report.md"
HTML = "capabilities.html"
HEADLINE = {"math500": "accuracy", "ifeval": "prompt_level_strict_acc", "livecodebench": "pass@1"}
NAMES = {"math500": "MATH500", "ifeval": "IFEval", "livecodebench": "LiveCodeBench"}


def scores(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per benchmark: n, its metrics (the graders' aggregates), and in think mode how many replies
    had no </think> (think_unclosed)."""
    out: dict[str, dict[str, Any]] = {}
    for bench in HEADLINE:
        rs = [r for r in records if r["benchmark"] == bench]
        if not rs:
            continue
        s: dict[str, Any] = {"n": len(rs)}
        if bench == "math500":
            s["accuracy"] = sum(r["correct"] for r in rs) / len(rs)
        elif bench == "ifeval":
            from rlver_jax.eval.capabilities import grade_ifeval

            s.update(grade_ifeval.aggregate(rs))
        else:
            from rlver_jax.eval.capabilities import grade_code

            s["pass@1"] = grade_code.pass_at_1([bool(r["correct"]) for r in rs])  # the verdicts `correct` counts
            # how many programs ran under each confinement layer (sandbox.py), for the record
            layers = [r["sandbox"] for r in rs if r.get("sandbox")]
            names = sorted({k for x in layers for k in x})
            s["sandbox_layers"] = {k: sum(bool(x.get(k)) for x in layers) for k in names}
        s["correct"] = sum(bool(r["correct"]) for r in rs)
        s["cut_by_length"] = sum(not r["stopped"] for r in rs)
        s["rejected"] = sum(bool(r.get("rejected")) for r in rs)
        if any(r["think_closed"] is not None for r in rs):
            s["think_unclosed"] = sum(r["think_closed"] is False for r in rs)
        out[bench] = s
    return out


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def markdown(s: dict[str, dict[str, Any]], info: dict[str, Any]) -> str:
    lines = [f"# Capabilities: {info['policy']}", "",
             f"Policy {info['source']} ({info['backend']}, {'think' if info['think'] else 'no-think'}), temperature "
             f"{info['temperature']}, at most {info['max_new_tokens']} new tokens.", "",
             "| benchmark | n | metric | score (%) | other metrics (%) |", "|---|---:|---|---:|---|"]
    for bench, v in s.items():
        head = HEADLINE[bench]
        others = ", ".join(f"{k} {_pct(x)}" for k, x in v.items() if isinstance(x, float) and k != head)
        extra = [f"{v['think_unclosed']} without </think>"] if "think_unclosed" in v else []
        if v["cut_by_length"]:
            extra.append(f"{v['cut_by_length']} cut by the token limit")
        if v["rejected"]:
            extra.append(f"{v['rejected']} refused by the endpoint")
        lines.append(f"| {NAMES[bench]} | {v['n']} | {head} | {_pct(v[head])} | "
                     f"{'; '.join(x for x in [others] + extra if x) or '-'} |")
    if info.get("protocol"):
        lines += ["", "## Protocol", "", "| field | value |", "|---|---|"]
        lines += [f"| {k} | {protocol.shown(v)} |" for k, v in info["protocol"].items()]
    lines += ["", f"Per item: items.jsonl; every answer: {HTML}."]
    return "\n".join(lines) + "\n"


def write_outputs(workdir: pathlib.Path, records: list[dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
    s = scores(records)
    atomic_write_text(workdir / SCORES, json.dumps({**s, "run": info}, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(workdir / REPORT, markdown(s, info))
    from rlver_jax.eval.html_report import render

    atomic_write_text(workdir / HTML, render("capabilities.html.j2", run=info, scores=s, names=NAMES,
                                             headline=HEADLINE, items=_views(records), pct=_pct))
    return s


def _views(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for n, r in enumerate(records):
        detail = {"math500": lambda: f"gold {r['answer']}; extracted {r['extracted'] or '-'}",
                  "ifeval": lambda: ", ".join(f"{i} {'ok' if ok else 'not followed'}" for i, ok in
                                              zip(r["instruction_id_list"], r["inst_level_strict_acc"])),
                  "livecodebench": lambda: (f"{sum(x is True for x in r['results'])} of {r['tests']} tests passed"
                                            + (f"; {r['error']}" if r["error"] else ""))}[r["benchmark"]]()
        out.append({"index": n, "benchmark": r["benchmark"], "id": r["id"], "question": r["question"],
                    "reply": r["reply"], "graded_text": r["graded_text"], "correct": bool(r["correct"]),
                    "think_closed": r["think_closed"], "stopped": r["stopped"], "detail": detail,
                    "program": r.get("program", "")})
    return out

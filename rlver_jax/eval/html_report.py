"""Self-contained HTML pages for reading dialogues: an evaluation's report.html and compare.html.

Every page is one static file (inline CSS, JS and SVG; no network, opens from disk), rendered by
jinja2 with autoescaping always on: model and simulator text is untrusted and only ever reaches
the page as escaped text, never as markup. Everything is rendered on the server side; the page's
script only sorts, filters and shows or hides what is already there (it never builds markup from
text). Transcripts are read as the dicts saved on disk (rlver_jax.rollout.episodes `_finish`);
fields that an older or partial record lacks show as a dash.

The training-run pages (launch/view.py) live in rlver_jax.eval.run_view and share the
environment, dialogue views and SVG geometry defined here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import markupsafe

from rlver_jax.files import atomic_write_text, read_jsonl
from rlver_jax.plots import end_color
from rlver_jax.simulator.profiles import goal_kind

REPORT_HTML = "report.html"
COMPARE_HTML = "compare.html"

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("rlver_jax.eval", "templates"),
    autoescape=True,  # every template, whatever its name: model text is untrusted
    undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
_ENV.globals["color"] = end_color
# The page's one script, inline, allowed by its hash in the page's Content-Security-Policy.
_SCRIPT = _ENV.loader.get_source(_ENV, "report.js")[0]
_ENV.globals["script"] = markupsafe.Markup(_SCRIPT)
_ENV.globals["script_hash"] = "sha256-" + base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
_ENV.filters["num"] = lambda v, digits=1: "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) \
    else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))


def render(template: str, **context: Any) -> str:
    """One page from rlver_jax/eval/templates/`template`."""
    return _ENV.get_template(template).render(**context)


# ----------------------------------------------------------------------------- dialogue views


def _turn_views(t: Mapping[str, Any], records: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for turn in t.get("turns", ()):
        rec = records.get(turn.get("turn"), {})
        judged = rec.get("scored", "change" in turn)
        out.append({
            "turn": turn.get("turn"), "reply": turn.get("reply", ""), "thinking": turn.get("thinking", ""),
            "raw": turn.get("raw", ""), "format_ok": turn.get("format_ok", True), "stopped": turn.get("stopped", True),
            "judged": judged and "emotion" in turn, "change": turn.get("change"), "emotion": turn.get("emotion"),
            "band": turn.get("band"), "user": turn.get("user"),
            "thoughts": turn.get("simulator_thoughts") or rec.get("thoughts") or "",
            "reply_thoughts": rec.get("reply_thoughts") or "",
            "change_proposed": rec.get("change_proposed"), "attempts": rec.get("attempts"),
            "error": rec.get("error"),
        })
    return out


def dialogue_view(t: Mapping[str, Any], index: int) -> dict[str, Any]:
    """What a page shows of one transcript record; `index` names its element (dlg-INDEX)."""
    state = t.get("simulator_state") or {}
    profile = state.get("profile") or {}
    records = {r["turn"]: r for r in state.get("records", ()) if "turn" in r}
    opening = next((m["content"] for m in t.get("messages", ()) if m.get("role") == "user"), None)
    task = profile.get("task", "")
    turns = _turn_views(t, records)
    return {
        "index": index, "id": t.get("profile_id", "?"), "language": t.get("language", "-"),
        "main_cha": profile.get("main_cha", "-"), "task": task, "goal": (goal_kind(task) or "other") if task else "-",
        "traits": list(profile.get("cha_group", ())), "player": profile.get("player", ""),
        "scene": profile.get("scene", ""), "final_emotion": t.get("final_emotion"),
        "end_reason": t.get("end_reason") or "unknown", "turns": turns, "n_turns": len(turns),
        "emotions": list(t.get("emotions", ())), "opening": opening,
        "opening_thoughts": records.get(0, {}).get("reply_thoughts", ""),
        "simulator_error": bool(t.get("simulator_error")), "error": state.get("error"),
        "format_failure": bool(t.get("format_failure")), "truncated": bool(t.get("truncated")),
        "reward": t.get("reward"),  # rollout.rewards; none in a benchmark transcript of before rewards were stored
    }


def levels_of(transcripts: Sequence[Mapping[str, Any]]) -> list[float]:
    """The band lines to draw (floor, band_b, band_a, ceiling) from the first record's rules."""
    for t in transcripts:
        rules = (t.get("simulator_state") or {}).get("rules")
        if rules:
            return [rules[k] for k in ("floor", "band_b", "band_a", "ceiling")]
    return []


# ----------------------------------------------------------------------------- SVG geometry


def emotion_chart(series: Sequence[Sequence[float]], width: int = 320, height: int = 120,
                  pad: int = 18, x_max: int | None = None) -> dict[str, Any]:
    """Emotion trajectories on a fixed 0-100 scale: for each series, its points as (x, y, value)
    in SVG coordinates, and `x` / `y` mapping a turn index and an emotion value to pixels."""
    x_max = max(x_max if x_max is not None else max((len(s) - 1 for s in series), default=1), 1)

    def x(i: float) -> float:
        return round(pad + i * (width - 2 * pad) / x_max, 1)

    def y(v: float) -> float:
        return round(pad + (1 - min(max(v, 0), 100) / 100) * (height - 2 * pad), 1)

    return {"width": width, "height": height, "pad": pad, "x_max": x_max, "x": x, "y": y,
            "series": [[(x(i), y(v), v) for i, v in enumerate(s)] for s in series]}


_ENV.globals["emotion_chart"] = emotion_chart


def line_chart(xs: Sequence[float], series: Mapping[str, Sequence[float | None]], y_lo: float, y_hi: float,
               width: int = 440, height: int = 180, pad: int = 30, max_dots: int = 60) -> dict[str, Any]:
    """Curves over steps: per series name, its finite values as an SVG polyline ("x,y ...")
    joined across missing steps (an evaluation every k steps), and its points as dots while there
    are at most `max_dots`; plus the axis ticks."""
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0, 1)
    span_x, span_y = (x_hi - x_lo) or 1, (y_hi - y_lo) or 1

    def px(v: float) -> float:
        return round(pad + (v - x_lo) * (width - 2 * pad) / span_x, 1)

    def py(v: float) -> float:
        return round(height - pad - (v - y_lo) * (height - 2 * pad) / span_y, 1)

    lines = {}
    for name, ys in series.items():
        pts = [(px(x), py(y), x, y) for x, y in zip(xs, ys)
               if isinstance(y, (int, float)) and math.isfinite(y)]
        lines[name] = {"points": " ".join(f"{p[0]},{p[1]}" for p in pts),
                       "dots": pts if len(pts) <= max_dots else []}
    x_ticks = sorted({round(x_lo + k * (x_hi - x_lo) / 4) for k in range(5)})
    y_ticks = [y_lo + k * span_y / 4 for k in range(5)]
    return {"width": width, "height": height, "pad": pad, "lines": lines,
            "x_ticks": [(px(v), v) for v in x_ticks], "y_ticks": [(py(v), round(v, 3)) for v in y_ticks]}


def histogram(values: Sequence[float], lo: float = 0, hi: float = 100, bins: int = 10, width: int = 320,
              height: int = 120, pad: int = 20) -> dict[str, Any]:
    """Counts of `values` in `bins` equal bins over [lo, hi] (hi falls in the last bin) as bars."""
    counts = [0] * bins
    for v in values:
        counts[min(max(int((v - lo) * bins / (hi - lo)), 0), bins - 1)] += 1
    top = max(counts, default=0) or 1
    bar_w = (width - 2 * pad) / bins
    bars = []
    for i, c in enumerate(counts):
        h = c * (height - 2 * pad) / top
        bars.append({"x": round(pad + i * bar_w, 1), "y": round(height - pad - h, 1), "w": round(bar_w - 2, 1),
                     "h": round(h, 1), "count": c, "lo": lo + i * (hi - lo) / bins,
                     "hi": lo + (i + 1) * (hi - lo) / bins})
    return {"width": width, "height": height, "pad": pad, "bars": bars, "lo": lo, "hi": hi}


# ----------------------------------------------------------------------------- pages


def render_eval(summary: Mapping[str, Any], transcripts: Sequence[Mapping[str, Any]]) -> str:
    """report.html of one evaluation: the scores of sentient.json and every dialogue."""
    views = [dialogue_view(t, i) for i, t in enumerate(transcripts)]
    scored = [v for v in views if not v["simulator_error"] and v["final_emotion"] is not None]
    return render("eval.html.j2", summary=summary, run=summary.get("run", {}), dialogues=views, scored=scored,
                  levels=levels_of(transcripts), hist=histogram([v["final_emotion"] for v in scored]),
                  overview=emotion_chart([v["emotions"] for v in scored], width=420, height=160))


def write_eval_report(workdir: pathlib.Path, summary: Mapping[str, Any],
                      transcripts: Sequence[Mapping[str, Any]]) -> pathlib.Path:
    """WORKDIR/report.html."""
    return atomic_write_text(pathlib.Path(workdir) / REPORT_HTML, render_eval(summary, transcripts))


def render_compare(result: Mapping[str, Any], transcripts: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """compare.html: the runs of `result` (compare.compare_runs) paired per profile; `transcripts`
    maps each run label to its records by profile id (a run without transcripts maps to {})."""
    labels = list(result["runs"])
    base, others = labels[0], labels[1:]
    pairs, index = [], 0
    for p in result["per_profile"]:
        views = []
        for label in labels:
            t = transcripts.get(label, {}).get(p["id"])
            views.append(None if t is None else dialogue_view(t, index))
            index += 1
        first = next((v for v in views if v is not None), None)
        pairs.append({"id": p["id"], "finals": [p[label] for label in labels], "dialogues": views,
                      "diffs": [p[o] - p[base] for o in others], "first": first,
                      "ends": [v["end_reason"] if v else "-" for v in views]})
    scatter = [emotion_chart([], width=260, height=260, pad=26, x_max=100) for _ in others]
    all_t = [t for by_id in transcripts.values() for t in by_id.values()]
    return render("compare.html.j2", result=result, labels=labels, base=base, others=others, pairs=pairs,
                  scatter=scatter, levels=levels_of(all_t))


def write_compare_report(out: pathlib.Path, result: Mapping[str, Any]) -> pathlib.Path:
    """OUT/compare.html, reading each run's transcripts.jsonl (when there is one)."""
    transcripts = {}
    for label, run in result["runs"].items():
        path = pathlib.Path(run["dir"]) / "transcripts.jsonl"
        transcripts[label] = {t["profile_id"]: t for t in read_jsonl(path)} if path.exists() else {}
    return atomic_write_text(pathlib.Path(out) / COMPARE_HTML, render_compare(result, transcripts))


def rewrite_eval_report(workdir: pathlib.Path) -> pathlib.Path:
    """report.html again from an evaluation directory's sentient.json and transcripts.jsonl (the
    dialogues in sentient.json's profile order)."""
    workdir = pathlib.Path(workdir)
    summary = json.loads((workdir / "sentient.json").read_text(encoding="utf-8"))
    by_id = {t["profile_id"]: t for t in read_jsonl(workdir / "transcripts.jsonl")}
    order = [p["id"] for p in summary.get("per_profile", ())]
    return write_eval_report(workdir, summary, [by_id[i] for i in order if i in by_id])

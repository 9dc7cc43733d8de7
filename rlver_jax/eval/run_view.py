"""Pages for reading a training run: `python launch/view.py RUN_DIR`.

RUN_DIR/view/index.html holds the curves over steps (metrics.jsonl) and one row per step; each
step's batch (RUN_DIR/transcripts/train_STEP.jsonl) gets its own page, train_STEP.html, with the
dialogues of each GRPO group side by side, their rewards and advantages, and each in-loop
evaluation (eval_STEP.jsonl) an evaluation page like report.html. One page per step keeps a
1000-step run's index small and fast; a step page is written once and rewritten only when its
transcript file (or the page templates) is newer, so rerunning view.py during a run costs the new steps only.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rlver_jax.eval import html_report
from rlver_jax.eval.sentient import summarize
from rlver_jax.files import atomic_write_text, read_jsonl
from rlver_jax.rl.algorithms import ALGORITHMS, ESTIMATORS
from rlver_jax.rollout.sequence import DialogueSequence

VIEW_DIR = "view"
_TEMPLATES = pathlib.Path(html_report.__file__).parent / "templates"
INDEX_HTML = "index.html"
_TRANSCRIPT = re.compile(r"^(train|eval)_(\d+)\.jsonl$")
# Curves of the index page: (title, y range, metrics.jsonl keys); each line named in words (LABELS).
CURVES = (
    ("reward and rates", (0.0, 1.0), ("reward_mean", "success_rate", "user_left_rate", "format_failure_rate")),
    ("emotion", (0.0, 100.0), ("emotion_mean", "eval_score")),
)
LABELS = {"reward_mean": "reward", "success_rate": "success (reached 100)", "user_left_rate": "user left (floor)",
          "format_failure_rate": "format failures", "emotion_mean": "final emotion (training)",
          "eval_score": "held-out score (in-loop evaluation)"}
# What every number means (docs/metrics.md), linked from the pages as a file of this checkout.
GLOSSARY = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "metrics.md").as_uri()
CURVE_COLORS = ("#1f77b4", "#2a9d4a", "#d62728", "#8c564b")
# Columns of the index's step table: (metrics.jsonl key, header, digits).
STEP_COLUMNS = (("reward_mean", "reward", 3), ("emotion_mean", "emotion", 1), ("success_rate", "success", 2),
                ("user_left_rate", "user left", 2), ("format_failure_rate", "format fail.", 2),
                ("simulator_errors", "sim. errors", 0), ("turns_mean", "turns", 1), ("eval_score", "eval score", 1))


@dataclasses.dataclass(frozen=True)
class AdvantageSettings:
    """How the run's trainer gave a dialogue its advantage: its config.rl (the algorithm's row of
    rlver_jax/rl/algorithms.py, with the fields a run set on its own) read as the trainer resolves it."""

    per_dialogue: bool = True  # one advantage per dialogue to show (the estimator's kind); else per token (GAE)
    normalize_std: bool = True
    eps: float = 1e-6
    estimator: str = "grpo"
    turn_credit_weight: float = 0.0
    dynamic_sampling: bool = False
    overlong_shaping: bool = False

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any] | None) -> AdvantageSettings:
        rl = (config or {}).get("rl", {})
        row = ALGORITHMS.get(rl.get("algo", "grpo"))
        if row is None:  # an algorithm this version does not know
            return cls(per_dialogue=False, estimator=str(rl.get("estimator") or rl.get("algo")))

        def field(name: str, default: Any) -> Any:  # "" or None: the row's (rlver_jax.rl.settings.RLSettings)
            value = rl.get(name)
            return default if value in ("", None) else value

        estimator = field("estimator", row.estimator)
        kind = ESTIMATORS.get(estimator)
        return cls(per_dialogue=kind is not None and kind.dialogue_advantages,
                   normalize_std=field("grpo_normalize_std", row.normalize_std), eps=rl.get("grpo_eps", 1e-6),
                   estimator=estimator, turn_credit_weight=float(rl.get("turn_credit_weight") or 0.0),
                   dynamic_sampling=bool(field("dynamic_sampling", row.dynamic_sampling)),
                   overlong_shaping=bool(field("overlong_penalty", row.overlong_penalty)))

    @property
    def description(self) -> str:
        """The step page's sentence on the advantages shown."""
        kind = ESTIMATORS.get(self.estimator)
        if kind is None:
            return f"Advantages of estimator {self.estimator!r}: not shown."
        summary = kind.summary.format(std=f" / (sample std + {self.eps})" if self.normalize_std else "")
        if not self.per_dialogue:
            return f"Advantages ({self.estimator}): {summary}."
        notes = [f"{self.estimator}: {summary}"]
        if self.overlong_shaping:
            notes.append("the reward includes its turns' overlong penalties")
        if self.dynamic_sampling:
            notes.append("0 in a group whose rewards are all equal (dynamic sampling drops it: metric filtered_groups)")
        if self.turn_credit_weight:
            notes.append(f"plus {self.turn_credit_weight} x its turns' group-relative emotion changes, averaged over "
                         "its tokens")
        return "Advantage of a dialogue, as the trainer computed it (" + "; ".join(notes) + ")."


def _trainable(t: Mapping[str, Any]) -> bool:
    """The trainer leaves out dialogues the simulator failed on and those without a policy turn."""
    return not t.get("simulator_error") and bool(t.get("turns"))


def step_groups(records: Sequence[Mapping[str, Any]], settings: AdvantageSettings) -> list[dict[str, Any]]:
    """A batch's dialogues by GRPO group (first appearance order), each with its reward and the
    advantage the trainer gave it (the record's "advantage", written by the training loop); None
    for a dialogue left out of training, with PPO, or in a transcript written without one."""
    by_group: dict[Any, list[tuple[int, Mapping[str, Any]]]] = {}
    for i, t in enumerate(records):
        by_group.setdefault(t.get("group", i), []).append((i, t))
    groups = []
    for gid, members in by_group.items():
        used = [t for _, t in members if _trainable(t)]
        dialogues = [(html_report.dialogue_view(t, i),
                      t.get("advantage") if settings.per_dialogue and _trainable(t) else None)
                     for i, t in members]
        rewards = [float(t.get("reward") or 0.0) for t in used]
        groups.append({"id": gid, "dialogues": dialogues, "first": dialogues[0][0],
                       "mean": sum(rewards) / len(rewards) if rewards else None,
                       "spread": max(rewards) - min(rewards) if rewards else None})
    return groups


def _transcript_files(run_dir: pathlib.Path) -> dict[tuple[str, int], pathlib.Path]:
    directory = run_dir / "transcripts"
    found = {}
    if directory.is_dir():
        for path in directory.iterdir():
            if m := _TRANSCRIPT.match(path.name):
                found[(m.group(1), int(m.group(2)))] = path
    return found


def _page_name(kind: str, step: int) -> str:
    return f"{kind}_{step:06d}.html"


def _stale(page: pathlib.Path, source: pathlib.Path) -> bool:
    """Missing, or older than its transcripts or than the templates it was made from."""
    if not page.exists():
        return True
    templates = max(p.stat().st_mtime for p in _TEMPLATES.iterdir())
    return page.stat().st_mtime < max(source.stat().st_mtime, templates)


def _curves(metrics: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    steps = [m["step"] for m in metrics]
    out = []
    for title, (lo, hi), keys in CURVES:
        present = [k for k in keys if any(isinstance(m.get(k), (int, float)) for m in metrics)]
        if not present:
            continue
        chart = html_report.line_chart(steps, {k: [m.get(k) for m in metrics] for k in present}, lo, hi)
        out.append({"title": title, "chart": chart, "names": present, "labels": LABELS,
                    "colors": dict(zip(present, CURVE_COLORS))})
    return out


def write_run_view(run_dir: str | pathlib.Path, out: str | pathlib.Path | None = None) -> pathlib.Path:
    """Write (or bring up to date) the pages of the training run in `run_dir` into `out`
    (default RUN_DIR/view); returns the index page."""
    run_dir = pathlib.Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    files = _transcript_files(run_dir)
    if not metrics_path.exists() and not files:
        raise FileNotFoundError(f"{run_dir} holds neither metrics.jsonl nor transcripts/: give the work directory "
                                "of a run of launch/train.py (config.workdir)")
    out = pathlib.Path(out) if out is not None else run_dir / VIEW_DIR
    config_path = run_dir / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else None
    settings = AdvantageSettings.from_run_config(config)
    metrics = sorted(read_jsonl(metrics_path), key=lambda m: m["step"]) if metrics_path.exists() else []
    by_step = {m["step"]: m for m in metrics}
    train_steps = sorted(step for kind, step in files if kind == "train")
    name = run_dir.resolve().name
    for (kind, step), source in sorted(files.items()):
        page = out / _page_name(kind, step)
        if not _stale(page, source):
            continue
        records = read_jsonl(source)
        if kind == "eval":
            summary = {**summarize([DialogueSequence.from_record(r) for r in records]),
                       "run": {"policy": f"{name} step {step} (in-loop evaluation)"}}
            html = html_report.render_eval(summary, records)
        else:
            i = train_steps.index(step)
            html = html_report.render(
                "train_step.html.j2", run=name, step=step, metrics=by_step.get(step, {}), settings=settings,
                groups=step_groups(records, settings), levels=html_report.levels_of(records),
                prev=_page_name("train", train_steps[i - 1]) if i else None,
                next=_page_name("train", train_steps[i + 1]) if i + 1 < len(train_steps) else None,
                columns=STEP_COLUMNS, glossary=GLOSSARY)
        atomic_write_text(page, html)
    steps = sorted(set(by_step) | {step for _, step in files})
    rows = [{"step": s, "metrics": by_step.get(s, {}),
             "train": _page_name("train", s) if ("train", s) in files else None,
             "eval": _page_name("eval", s) if ("eval", s) in files else None} for s in steps]
    evals = [m for m in metrics if isinstance(m.get("eval_score"), (int, float))]
    summary = {"steps": len(metrics), "last": metrics[-1] if metrics else None,
               "best_eval": max(evals, key=lambda m: m["eval_score"]) if evals else None,
               "simulator_errors": int(sum(m.get("simulator_errors") or 0 for m in metrics))}
    html = html_report.render("train_index.html.j2", run=name, run_dir=str(run_dir), rows=rows, summary=summary,
                              curves=_curves(metrics), columns=STEP_COLUMNS, config=config or {}, glossary=GLOSSARY)
    return atomic_write_text(out / INDEX_HTML, html)

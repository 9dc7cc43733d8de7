"""An evaluation's outputs from its transcripts: sentient.json, report.md and the PNG plots."""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from rlver_jax import plots
from rlver_jax.eval import html_report, protocol
from rlver_jax.eval.degenerate import degenerate_judgements
from rlver_jax.eval.sentient import breakdown, summarize
from rlver_jax.files import atomic_write_text
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.rollout.summary import reencoded_turns
from rlver_jax.simulator.agent import clipped_changes
from rlver_jax.simulator.profiles import Profile
from rlver_jax.text import degeneration

TRAJECTORIES_PNG = "trajectories.png"
FINAL_EMOTIONS_PNG = "final_emotions.png"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; floats with one decimal, None as a dash."""
    def cell(v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return f"{v:.1f}" if isinstance(v, float) else str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def json_text(obj: Any) -> str:
    """Strict JSON: NaN (a score over no dialogue) becomes null."""
    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x
    return json.dumps(clean(obj), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def write_outputs(workdir: pathlib.Path, transcripts: Sequence[dict[str, Any]],
                  profiles: Mapping[str, Profile], run: dict[str, Any], levels: Sequence[float],
                  card: Mapping[str, Any], probes: Mapping[str, Sequence[dict[str, Any]]] | None = None
                  ) -> dict[str, Any]:
    """Write sentient.json (the scores, `run` describing what was evaluated, `card` its
    protocol card: eval/protocol.py, the scores of the robustness `probes`: their transcripts by
    name), the plots, report.md and report.html (every dialogue, to read) for `transcripts` (one
    per profile, in profile order); returns the scores."""
    dialogues = [DialogueSequence.from_record(t) for t in transcripts]
    summary = {**summarize(dialogues), "run": run, "protocol": dict(card),
               "probes": probe_scores(probes or {}, run["rules"]["initial_emotion"])}
    summary["degenerate_judgements"] = degenerate_judgements((d.simulator_state for d in dialogues),
                                                             run["rules"]["max_change"])
    trained = set(run.get("trained_on") or ())
    for row in summary["per_profile"]:
        if row["id"] in trained:
            row["trained_on"] = True  # the policy's own run trained on this profile: not held out
    atomic_write_text(workdir / "sentient.json", json_text(summary))
    plots.emotion_trajectories(transcripts, workdir / TRAJECTORIES_PNG, title=f"emotion per dialogue: {run['policy']}",
                               levels=levels)
    plots.final_emotion_histogram(transcripts, workdir / FINAL_EMOTIONS_PNG,
                                  title=f"final emotions: {run['policy']}")
    atomic_write_text(workdir / "report.md", render(summary, dialogues, profiles))
    html_report.write_eval_report(workdir, summary, transcripts)
    return summary


def probe_scores(probes: Mapping[str, Sequence[dict[str, Any]]], initial_emotion: float) -> dict[str, Any]:
    """Each robustness probe's scores (eval/probes.py) and whether the simulator `rewarded` it:
    its score ended above the initial emotion."""
    out = {}
    for name, records in probes.items():
        scores = summarize([DialogueSequence.from_record(r) for r in records])
        del scores["per_profile"]
        out[name] = {**scores, "rewarded": scores["score"] > initial_emotion}  # NaN (none scored): False
    return out


def _sampled(card: Mapping[str, Any]) -> str:
    """", temperature 0.5, at most 2048 tokens" of a served simulator's card; "" otherwise."""
    if card.get("simulator.temperature") is None:
        return ""
    return f", temperature {card['simulator.temperature']:g}, at most {card['simulator.max_tokens']} tokens"


def _hashed(card: Mapping[str, Any]) -> str:
    """" (16 profiles, sha256 791e7b2679d4)" from the card; "" without one."""
    if "profiles.sha256" not in card:
        return ""
    return f" ({card['profiles.count']} profiles, sha256 {protocol.shown(card['profiles.sha256'])})"


def protocol_table(card: Mapping[str, Any]) -> str:
    """The protocol card as a Markdown table, field by field."""
    return table(["field", "value"], [[k, protocol.shown(v)] for k, v in card.items()])


def _group_rows(dialogues: Sequence[DialogueSequence], profiles: Mapping[str, Profile]) -> list[list[Any]]:
    keys = {
        "end reason": lambda d: d.end_reason,
        "language": lambda d: d.language,
        "personality": lambda d: profiles[d.profile_id].personality,
        "hidden goal": lambda d: profiles[d.profile_id].goal or "other",
    }
    rows = []
    for name, key in keys.items():
        for g in breakdown(dialogues, key):
            rows.append([name, g["group"], g["n"], g["score"], g["success"], g["failure"], g["simulator_errors"]])
    return rows


def render(summary: dict[str, Any], dialogues: Sequence[DialogueSequence], profiles: Mapping[str, Profile]) -> str:
    """report.md: the scores, the protocol, breakdowns, the plots and one row per dialogue."""
    run, n = summary["run"], summary["n"]
    card = summary.get("protocol") or {}
    rules = run["rules"]
    judged = sum(1 for d in dialogues for r in d.simulator_state.get("records", ()) if r["scored"])
    out = [f"# Sentient benchmark: {run['policy']}\n\n"]
    if summary["simulator_errors"]:
        out.append(f"> **Warning: {summary['simulator_errors']} of {summary['simulator_errors'] + n} dialogues ended "
                   "in a simulator error.** They are left out of every score below, so the score is not "
                   "comparable with published Sentient scores; see their transcripts, fix the simulator "
                   "and rerun (finished dialogues are kept; remove the failed ones from transcripts.jsonl "
                   "to replay them).\n\n")
    if trained := [p["id"] for p in summary["per_profile"] if p.get("trained_on")]:
        out.append(f"> **Warning: the policy's training run trained on {len(trained)} of these {len(dialogues)} "
                   f"profiles** ({', '.join(trained[:8])}{', ...' if len(trained) > 8 else ''}; `trained_on` in "
                   "sentient.json): their scores are not held out.\n\n")
    if summary.get("degenerate_judgements"):
        out.append("> **Warning: the simulator's judgements look degenerate "
                   f"({summary['degenerate_judgements']}).** "
                   "The score then measures the simulator model, not the policy; use a stronger simulator or "
                   "check its prompts.\n\n")
    out.append(table(["metric", "value"], [
        ["score (mean final emotion)", summary["score"]],
        ["success (reached 100)", f"{summary['success']} / {n}"],
        ["failure (left below the floor)", f"{summary['failure']} / {n}"],
        ["dialogues scored", n],
        ["simulator errors (not scored)", summary["simulator_errors"]],
        [f"changes clipped to +-{rules['max_change']}",
         f"{clipped_changes(d.simulator_state for d in dialogues)} / {judged} judged turns"],
        ["mean policy turns", summary["mean_turns"]],
        ["degenerate replies (noise, loops, wrong language, empty)",
         degeneration.describe(summary["degenerate_replies"])],
        ["replies sharing a skeleton with another user's (template_rate)", f"{summary['template_rate']:.0%}"],
        ["policy turns encoded afresh (beyond the KV cache)",
         f"{reencoded_turns(dialogues)} / {sum(len(d.turns) for d in dialogues)}"],
    ]))
    out.append(
        f"\nPolicy: {run['source']} ({run['backend']}, {'think' if run['think'] else 'no-think'}). "
        f"Simulator: {run['simulator']} ({run['difficulty']}{_sampled(card)}). Profiles: {run['profiles']}"
        f"{_hashed(card)}.\n"
        f"Protocol: initial emotion {rules['initial_emotion']}, at most {rules['max_turns']} rounds"
        f"{'' if rules['score_final_turn'] else ' (the last reply not judged)'}, success at {rules['ceiling']}, "
        f"failure {'at or ' if rules['floor_inclusive'] else ''}below {rules['floor']}, "
        f"change per turn clipped to +-{rules['max_change']}.\n")
    if summary.get("probes"):
        rewarded = [name for name, p in summary["probes"].items() if p["rewarded"]]
        out.append(f"\n## Robustness probes\n\nCanned policies a sound simulator must not reward, played under "
                   f"the same protocol (initial emotion {rules['initial_emotion']}; eval/probes.py).\n\n")
        if rewarded:
            out.append(f"> **Warning: the simulator rewarded {', '.join(rewarded)}** (score above the initial "
                       "emotion): a policy trained against it can gain by such replies.\n\n")
        out.append(table(["probe", "score", "success", "failure", "n", "simulator errors", "template rate",
                          "rewarded"], [
            [name, p["score"], p["success"], p["failure"], p["n"], p["simulator_errors"],
             f"{p['template_rate']:.0%}", "YES" if p["rewarded"] else "no"]
            for name, p in summary["probes"].items()]))
    if summary.get("protocol"):
        out.append("\n## Protocol\n\nHow this result was obtained; `launch/eval.py --compare` refuses results whose "
                   "simulator, rules, profiles or prompts differ (docs/protocol.md).\n\n")
        out.append(protocol_table(summary["protocol"]))
    out.append("\n## Breakdown\n\n")
    out.append(table(["by", "group", "n", "score", "success", "failure", "simulator errors"],
                     _group_rows(dialogues, profiles)))
    out.append(f"\n## Plots\n\n![emotion trajectories]({TRAJECTORIES_PNG})\n\n"
               f"![final emotions]({FINAL_EMOTIONS_PNG})\n")
    out.append("\n## Dialogues\n\n")
    out.append(table(["profile", "language", "final emotion", "turns", "end reason", "trajectory"], [
        [d.profile_id, d.language, d.final_emotion, len(d.turns), d.end_reason,
         " ".join(str(e) for e in d.emotions)] for d in dialogues]))
    return "".join(out)

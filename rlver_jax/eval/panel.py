"""A panel of simulators: one evaluation played under each of several simulated users
(`config.eval.simulators`), since a Sentient score measures the simulator as much as the policy (SAGE
reports its leaderboard under four). Each member plays every profile in its own evaluation
directory, WORKDIR/simulators/K-MODEL (resumable, with its own report and probes); WORKDIR's
sentient.json and report.md then give each member's scores with a 95% interval, the panel's mean,
and the profiles on which the members disagree most.

The panel's sentient.json has the shape `launch/eval.py --compare` reads: `per_profile` holds each
profile's final emotion averaged over the members (a profile some member failed on is a
simulator error), and `protocol` each card field's one value, or every member's when they differ;
a compare of panels gives the simulators' rank agreement (eval/compare.rank_agreement).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlver_jax.eval.compare import mean_interval
from rlver_jax.eval.report import table
from rlver_jax.simulator import backends
from rlver_jax.simulator.templates import DIFFICULTIES

SUBDIR = "simulators"
DISAGREEMENTS_SHOWN = 10  # profiles listed by how far the members' final emotions spread


@dataclasses.dataclass(frozen=True)
class Member:
    """One simulator of a panel: a backend of the table (rlver_jax.simulator.backends) and the model
    and server it names ("" = config.simulator's)."""

    backend: str
    model: str = ""
    base_url: str = ""
    difficulty: str = ""  # the user's (templates.DIFFICULTIES); "" = config.simulator.difficulty
    label: str = dataclasses.field(default="", compare=False)  # as config.eval.simulators gives it

    def directory(self, index: int) -> str:
        """Its evaluation directory under WORKDIR/SUBDIR: its place in the panel, its model's (or
        backend's) name and its user's difficulty when it sets one."""
        name = "-".join(filter(None, (self.model or self.backend, self.difficulty)))
        return f"{SUBDIR}/{index}-{re.sub(r'[^A-Za-z0-9._-]+', '_', name)}"

    def overrides(self) -> dict[str, str]:
        """The fields of config.simulator it sets."""
        return {k: v for k, v in (("backend", self.backend), ("model", self.model), ("base_url", self.base_url),
                                  ("difficulty", self.difficulty)) if v}


def parse_panel(value: str, field: str = "config.eval.simulators") -> tuple[Member, ...]:
    """"MEMBER,MEMBER" -> its members ("" = no panel); one ValueError names the field and the member.
    A member is MODEL@URL (a model served under the table's first served backend, openai), BACKEND
    (that backend under config.simulator's other settings: `embedded` plays on a CPU), BACKEND:MODEL
    or BACKEND:MODEL@URL; each may end in /DIFFICULTY, its user's (`embedded/challenging`: a
    harsher user of the same simulator, so a CPU panel has two members)."""
    members = [_member(item, f"{field}={value!r}") for item in (i.strip() for i in value.split(",")) if item]
    if len(set(members)) != len(members):
        raise ValueError(f"{field}={value!r} names a simulator twice; give each once")
    return tuple(members)


def _member(item: str, where: str) -> Member:
    """The member `item` of the panel `where` names, checked against its backend's row."""
    item, difficulty = _difficulty(item)
    head, at, url = item.partition("@")
    if ":" in head:
        backend, _, model = head.partition(":")
    elif at:
        backend, model = backends.first_served(), head
    else:
        backend, model = head, ""
    if backend not in backends.BACKENDS or (at and not (model and url.startswith(("http://", "https://")))):
        raise ValueError(f"{where}: {item!r} is not MODEL@URL nor a backend ({backends.BACKENDS.words()}); give each "
                         "simulator as served-model-name@http://host:port/v1, BACKEND, BACKEND:MODEL or "
                         "BACKEND:MODEL@URL, separated by commas")
    unread = [name for name, given in (("model", model), ("base_url", url)) if given and name not in
              backends.BACKENDS[backend].reads]
    if unread:
        raise ValueError(f"{where}: {item!r} gives a {' and a '.join(unread)}, which backend {backend!r} does not "
                         f"read; give it as {backend!r} alone")
    return Member(backend, model, url, difficulty, label=item + (f"/{difficulty}" if difficulty else ""))


def _difficulty(item: str) -> tuple[str, str]:
    """`item` without its /DIFFICULTY suffix, and that difficulty ("" when it names none)."""
    rest, slash, last = item.rpartition("/")
    return (rest, last) if slash and last in DIFFICULTIES else (item, "")


def _merged_card(cards: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One protocol card for the panel: each field's value when every member has the same, else
    the list of the members' values."""
    keys = list(dict.fromkeys(k for c in cards for k in c))
    out = {}
    for k in keys:
        values = [c.get(k) for c in cards]
        out[k] = values[0] if all(v == values[0] for v in values) else values
    return out


def summarize_panel(members: Sequence[Member], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The panel's sentient.json from its members' (`results`: each member's sentient.json, in panel order)."""
    labels = [m.label for m in members]
    finals = [{p["id"]: p["final_emotion"] for p in r["per_profile"] if p["end_reason"] != "simulator_error"}
              for r in results]
    ids = [p["id"] for p in results[0]["per_profile"]]
    common = [pid for pid in ids if all(pid in f for f in finals)]
    scores = {}
    for k, (label, r) in enumerate(zip(labels, results)):
        values = np.array(list(finals[k].values()), dtype=float)
        scores[label] = {"dir": members[k].directory(k), "score": r["score"], "ci95": mean_interval(values),
                         **{key: r[key] for key in ("success", "failure", "n", "simulator_errors")}}
    spread = sorted(((max(f[pid] for f in finals) - min(f[pid] for f in finals), pid) for pid in common),
                    key=lambda sp: (-sp[0], ids.index(sp[1])))
    member_scores = [s["score"] for s in scores.values() if s["score"] is not None]
    return {
        "score": float(np.mean(member_scores)) if member_scores else float("nan"),
        "n": len(common), "simulator_errors": len(ids) - len(common),
        "panel": scores,
        "disagreements": [{"id": pid, "spread": float(d), **{label: finals[k][pid] for k, label in enumerate(labels)}}
                          for d, pid in spread[:DISAGREEMENTS_SHOWN]],
        "per_profile": [{"id": pid, "end_reason": "panel" if pid in common else "simulator_error",
                         "final_emotion": float(np.mean([f[pid] for f in finals])) if pid in common else None,
                         "turns": None} for pid in ids],
        "protocol": _merged_card([r.get("protocol") or {} for r in results]),
    }


def render(summary: Mapping[str, Any], policy: str) -> str:
    """The panel's report.md."""
    rows = [[label, s["score"], f"[{s['ci95'][0]:.1f}, {s['ci95'][1]:.1f}]", s["success"], s["failure"], s["n"],
             s["simulator_errors"], f"[report]({s['dir']}/report.md)"] for label, s in summary["panel"].items()]
    labels = list(summary["panel"])
    out = [f"# Sentient benchmark: {policy}, under a panel of {len(labels)} simulators\n\n",
           f"Panel mean score: **{summary['score']:.1f}** (the mean of the members' scores; "
           f"{summary['n']} profiles scored under every member).\n\n",
           table(["simulator", "score", "95% CI", "success", "failure", "n", "simulator errors", "details"], rows),
           "\n## Where the simulators disagree most (final emotion)\n\n",
           table(["profile", "spread", *labels], [[d["id"], d["spread"], *(d[label] for label in labels)]
                                                   for d in summary["disagreements"]])]
    return "".join(out)

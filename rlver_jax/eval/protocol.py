"""The protocol card: how a Sentient result was obtained, recorded in sentient.json, report.md and
report.html, and what `launch/eval.py --compare` checks before it sets two results side by side.

SAGE's published numbers do not reproduce for its users, and the suspects are the parts of the
protocol nobody recorded (the simulator model and its sampling, the initial emotion, the prompts).
The card is one flat mapping of dotted fields to JSON values, grouped by their first part:

  simulator.*  the simulated user: backend, model and the ids its server lists (GET /models),
               sampling (temperature, max tokens), structured-output mode, difficulty, language
  rules.*      the emotion rules (initial emotion, clip, floor, ceiling, turns, judged turns)
  profiles.*   the profile file's sha256 and the number of profiles played
  prompts.*    the sha256 of each simulator prompt template and of the policy's system prompt
               when the config gives one (else OWN_PROMPT)
  policy.*     what was evaluated and how it sampled (what a comparison sets side by side), the
               rollout engine of a policy on our weights by its row's name (engines.table)
  run.*        where: the endpoints' URLs, the profile file's path, the project version and git
               commit, the date

A difference in a field of MOVES_SCORES (the first four groups) makes two scores incomparable:
`differences` names every differing field and `score_moving` says which of them refuse a comparison.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import pathlib
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import rlver_jax
from rlver_jax.llm_client import served_models
from rlver_jax.rollout import prompts as policy_prompts
from rlver_jax.rollout.episodes import RolloutSettings
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.simulator.settings import SimulatorSettings
from rlver_jax.simulator.templates import PROMPT_DIR

MOVES_SCORES = ("simulator.", "rules.", "profiles.", "prompts.")
NOT_COMPARED = ("run.date",)  # differs between any two runs and says nothing about their scores
OWN_PROMPT = "the project's own (rlver_jax/rollout/prompts.py)"  # prompts.policy_system without a configured prompt
_REPO = pathlib.Path(rlver_jax.__file__).resolve().parents[1]
_GIT_TIMEOUT_S = 5  # a git that hangs (a network file system) must not hold up the report


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.cache
def project_version() -> dict[str, str]:
    """The installed package's version and, in a git checkout, its commit ("+dirty" with local
    changes); "" where there is none."""
    from importlib import metadata

    try:
        version = metadata.version("rlver_jax")
    except metadata.PackageNotFoundError:
        version = ""
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty=+dirty", "--abbrev=40"], cwd=_REPO,
                                capture_output=True, text=True, timeout=_GIT_TIMEOUT_S, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"run.version": version, "run.commit": commit}


def simulator_fields(s: SimulatorSettings, served: Sequence[str] | None) -> dict[str, Any]:
    """The simulated user's fields, by its backend's row (simulator/backends.py): the model and the
    sampling it reads (None where it reads none), the URL where it is served; `served`: the ids its
    server lists (None: not asked or not listed)."""
    row = s.row

    def read(field: str, value: Any) -> Any:
        return value if field in row.reads else None

    return {"simulator.backend": s.backend,
            "simulator.model": s.client.model if "model" in row.reads else row.card_model,
            "simulator.served_models": list(served) if served is not None else None,
            "simulator.temperature": read("temperature", s.llm.temperature),
            "simulator.max_tokens": read("max_tokens", s.llm.max_tokens),
            "simulator.structured_output": read("structured_output", s.llm.structured_output),
            "simulator.difficulty": s.difficulty, "simulator.language": s.language or "each profile's own",
            "simulator.max_utterance_chars": s.llm.max_utterance_chars,
            **{f"rules.{k}": v for k, v in dataclasses.asdict(s.rules).items()},
            "run.simulator_url": s.client.base_url if row.served else None}


def card(simulator: SimulatorSettings, served: Sequence[str] | None, *, profiles_file: str | pathlib.Path,
         profiles: int, policy: Mapping[str, Any], sampling: SamplingSettings, rollout: RolloutSettings,
         seed: int) -> dict[str, Any]:
    """The protocol card of an evaluation of `profiles` profiles (the first of `profiles_file`)
    by the policy `policy` describes (policy.* fields: source, backend, think, engine, url) sampling by
    `sampling`, its system prompt `rollout.system_prompt` ("" = the project's own), against
    `simulator`."""
    path = pathlib.Path(profiles_file).expanduser()
    if rollout.system_prompt:
        system = rollout.system_prompt
    else:  # the project's own, by the dialogue's language and the think mode
        system = "\n".join(policy_prompts.system_prompt(lang, rollout.think) for lang in ("en", "zh"))
    return {
        **simulator_fields(simulator, served),
        "profiles.sha256": sha256_bytes(path.read_bytes()), "profiles.count": profiles,
        **{f"prompts.simulator.{p.name}": sha256_bytes(p.read_bytes()) for p in sorted(PROMPT_DIR.glob("*.txt"))},
        # A prompt given in the config moves scores (SAGE's own against ours); the project's own differs
        # only by the think mode, which is the policy's, so a think and a no-think run still compare.
        "prompts.policy_system": sha256_bytes(system.encode("utf-8")) if rollout.system_prompt else OWN_PROMPT,
        "policy.system_prompt_sha256": sha256_bytes(system.encode("utf-8")),
        **{f"policy.{k}": v for k, v in policy.items() if k != "url"},
        "policy.temperature": sampling.temperature, "policy.top_p": sampling.top_p, "policy.top_k": sampling.top_k,
        "policy.max_new_tokens": sampling.max_new_tokens, "policy.seed": seed,
        "policy.max_total_tokens": rollout.max_total_tokens, "policy.format_failure": rollout.format_failure,
        "policy.think_history": rollout.think_history,
        "run.policy_url": policy.get("url"), "run.profiles_file": str(path.resolve()),
        **stamp(),
    }


def stamp() -> dict[str, str]:
    """The run.* fields every result carries: the project version and commit, and the date (UTC)."""
    return {**project_version(),
            "run.date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def served_simulator_models(s: SimulatorSettings) -> list[str] | None:
    """The ids the simulator's server lists now (None for a backend that is not served, a replayed
    cache or a server that does not list them)."""
    if not s.row.served or s.llm.cache_replay_only:
        return None
    return served_models(s.client)


def differences(cards: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every field (but NOT_COMPARED) whose value is not the same in all `cards` (by run label),
    with each run's value (None where a card lacks the field); an empty card (a result written
    before cards were recorded) differs in a field "protocol" instead."""
    labels = list(cards)
    out: dict[str, dict[str, Any]] = {}
    if any(not c for c in cards.values()):
        out["protocol"] = {label: "recorded" if cards[label] else "not recorded" for label in labels}
    keys = sorted({k for c in cards.values() for k in c} - set(NOT_COMPARED))
    for key in keys:
        values = [cards[label].get(key) for label in labels if cards[label]]
        if any(v != values[0] for v in values[1:]):
            out[key] = {label: cards[label].get(key) for label in labels if cards[label]}
    return out


def score_moving(diff: Mapping[str, Any]) -> list[str]:
    """The fields of `diff` (`differences`) that move scores: they make a comparison mixed."""
    return [k for k in diff if k == "protocol" or k.startswith(MOVES_SCORES)]


def shown(value: Any) -> str:
    """A card's value as the reports show it: text as it is, a sha256 by its first 12 digits,
    anything else as JSON."""
    if isinstance(value, str):
        return value[:12] if len(value) == 64 and all(c in "0123456789abcdef" for c in value) else value
    return json.dumps(value, ensure_ascii=False)


def describe(diff: Mapping[str, Mapping[str, Any]], fields: Sequence[str]) -> str:
    """"simulator.temperature (a 0.5, b 0.9); ...": each of `fields` with every run's value."""
    return "; ".join(f"{k} (" + ", ".join(f"{label} {shown(v)}" for label, v in diff[k].items()) + ")"
                     for k in fields)

"""Training runs against a simulator that goes down, throttles or slows down (the scripted server's
faults), shared by tests/simulator_outage_test.py (in seconds) and benchmarks/simulator_outage.py
(the literal minutes): the simulator, the run's flags, what a run leaves to compare, and what the
server saw."""

from __future__ import annotations

import collections
import hashlib
import json
import pathlib
from typing import Any

from rlver_jax.files import read_jsonl
from rlver_jax.testing.scripted_server import ScriptedServer, route

# Metrics that are timings, and those of the sampler's float noise (its batches form as the turns
# come, so its log-probabilities differ in the 7th digit: the update's importance weights with them).
TIMING = ("tokens_per_second", "update_tokens_per_second", "rollout_seconds", "update_seconds", "wait_seconds")
NOISE = ("logprob_diff_sampler", "offpolicy_weight_max", "offpolicy_weight_mean")


def train_flags(steps: int, workdir: str | pathlib.Path, url: str) -> list[str]:
    """launch/train.py's flags of the tiny GRPO run cut to seconds a step (2 profiles x 4 dialogues of
    2 short turns, no in-loop evaluation, a checkpoint every 2 steps) against the served simulator at
    `url`, the raw replies shown to it (a random tiny model rarely closes its thought, and its
    dialogues would end before the simulator is asked)."""
    return ["--config=configs/grpo_think.py:tiny", f"--config.workdir={workdir}", f"--config.train.steps={steps}",
            "--config.rollout.profiles_per_step=2", "--config.rollout.max_new_tokens=8",
            "--config.simulator.max_turns=2", "--config.rl.micro_batch_size=2", "--config.train.eval_every=0",
            "--config.data.eval_holdout=2", "--config.checkpoint.save_every=2", "--config.checkpoint.async_save=False",
            "--config.rollout.format_failure=continue", "--config.simulator.backend=openai",
            f"--config.simulator.base_url={url}"]


def _number(request: dict[str, Any], salt: str) -> int:
    text = json.dumps(request["messages"], sort_keys=True) + salt
    return int(hashlib.sha256(text.encode()).hexdigest(), 16)


def _emotion(request: dict[str, Any]) -> str:
    return f"Intent: x\nFit: y\nInner reaction: z\nFeeling: w\nChange: {_number(request, 'change') % 13 - 4:+d}"


def _reply(request: dict[str, Any]) -> str:
    return f"Plan: go on\nResponse: I see, number {_number(request, 'reply') % 997}."


# A simulator whose answers are a function of the request: a run's dialogues do not depend on when
# (or how many times) it was asked.
SIMULATOR = route(emotion=_emotion, reply=_reply)


def outcome(workdir: pathlib.Path) -> tuple[list[dict], dict[str, list[dict]]]:
    """What a run leaves: its metrics without timings (the sampler's noise rounded to 4 places) and
    every transcript file."""
    metrics = [{k: round(v, 4) if k in NOISE else v for k, v in m.items() if k not in TIMING}
               for m in read_jsonl(workdir / "metrics.jsonl")]
    return metrics, {p.name: read_jsonl(p) for p in sorted((workdir / "transcripts").iterdir())}


def answered_twice(server: ScriptedServer) -> int:
    """Requests the server answered more than once (a request it lost going down, sent again, is
    answered once)."""
    bodies = collections.Counter(json.dumps(server.requests[i], sort_keys=True) for i in server.answered)
    return sum(count - 1 for count in bodies.values())


def inside_retry_after(server: ScriptedServer, slack_s: float = 0.2) -> int:
    """Requests that arrived inside a Retry-After window the server gave, beyond `slack_s` after
    its 429 was sent (what was sent before the client read it)."""
    return sum(sent + slack_s < t < sent + retry_after - 0.01 for sent, retry_after in server.throttled
               for t in server.arrivals)

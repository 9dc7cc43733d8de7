r"""Parse rate and answer latency of a simulator server, text and structured answers (issue 18).

  .venv/bin/python benchmarks/simulator_parse_rate.py --base_url=http://127.0.0.1:8080/v1 --model=NAME
  .venv/bin/python benchmarks/simulator_parse_rate.py --base_url=URL --model=NAME --profiles=8 --out=rate.json

For each mode of config.simulator.structured_output (--modes), each of --profiles shipped profiles
(half English, half Chinese) and each canned policy reply of the profile's language: one emotion
step on the reply, then one reply step, through the openai simulator backend (the real prompts,
parser, schema and fallback) with malformed_retries=0, so every step is one answer that parses or
is malformed. Steps run one at a time, so the latency is the server's for one request.

Prints per mode and step: answers, parsed, the parse rate and the mean / median / p90 seconds per
answer, and whether the server refused response_format (its json_schema rows then measured text
answers after the fallback; the refused request's time is in the first answer) or took the
`json_object` spelling. A mode that could not run (the server went away, ...) gets one line saying
why, and the modes already measured are kept. --out writes the same as JSON. docs/simulator.md holds measured numbers.
"""

import asyncio
import dataclasses
import json
import math
import pathlib
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

from absl import app, flags  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

from configs.simulator import get_simulator_config  # noqa: E402
from rlver_jax.simulator import (  # noqa: E402
    SimulatorOutputError,
    SimulatorSettings,
    SimulatorUnavailableError,
    build_simulator,
    check_endpoint,
    load_profiles,
)
from rlver_jax.simulator.llm_user import STRUCTURED_OUTPUTS  # noqa: E402
from rlver_jax.simulator.state import DialogueState  # noqa: E402

_BASE_URL = flags.DEFINE_string("base_url", None, "The simulator server's OpenAI-compatible base URL.", required=True)
_MODEL = flags.DEFINE_string("model", None, "The served model name.", required=True)
_API_KEY_ENV = flags.DEFINE_string("api_key_env", "SIMULATOR_API_KEY", "Environment variable holding the key.")
_PROFILES = flags.DEFINE_integer("profiles", 4, "Shipped profiles to play, half English and half Chinese.")
_MODES = flags.DEFINE_list("modes", list(STRUCTURED_OUTPUTS), "config.simulator.structured_output values.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 512, "Tokens per answer (config.simulator.max_tokens).")
_TIMEOUT = flags.DEFINE_float("timeout_s", 300.0, "Per request (a CPU server is slow).")
_OUT = flags.DEFINE_string("out", "", "Also write the results here as JSON.")

# Policy replies to judge: warm, a question, curt.
REPLIES = {
    "en": ["That sounds exhausting. It makes sense that you feel worn out after all of that.",
           "What happened next? How did you feel when they said that?",
           "Okay."],
    "zh": ["听起来真的很累，经历了这么多，你觉得疲惫是很正常的。",
           "后来发生了什么？他们那样说的时候，你心里是什么感受？",
           "哦。"],
}
STEPS = ("emotion", "reply")


def _profiles(n: int):
    shipped = load_profiles()
    en = [p for p in shipped if p.language == "en"]
    zh = [p for p in shipped if p.language == "zh"]
    return en[:math.ceil(n / 2)] + zh[:n // 2]


def _settings(mode: str) -> SimulatorSettings:
    c = get_simulator_config()
    c.base_url, c.model, c.api_key_env = _BASE_URL.value, _MODEL.value, _API_KEY_ENV.value
    c.structured_output, c.max_tokens, c.timeout_s = mode, _MAX_TOKENS.value, _TIMEOUT.value
    c.malformed_retries, c.max_retries = 0, 2
    return SimulatorSettings.from_config(c)


async def _timed(call):
    """(the call's result, or None when the answer was malformed; seconds)."""
    t0 = time.perf_counter()
    try:
        result = await call
    except SimulatorOutputError:
        result = None
    return result, time.perf_counter() - t0


async def measure(mode: str, profiles) -> dict[str, Any]:
    """Answers, parses and seconds per step of one mode."""
    outcomes: dict[str, list[tuple[bool, float]]] = {step: [] for step in STEPS}
    settings = _settings(mode)
    check_endpoint(settings)
    async with build_simulator(settings) as sim:
        for profile in profiles:
            start = await sim.start(profile)
            for reply in REPLIES[profile.language]:
                judgement, seconds = await _timed(sim.backend.judge(start, reply))
                outcomes["emotion"].append((judgement is not None, seconds))
                state: DialogueState = dataclasses.replace(
                    start, history=start.history + ({"role": "assistant", "content": reply},))
                thoughts = judgement.thoughts if judgement is not None else ""
                utterance, seconds = await _timed(sim.backend.speak(state, thoughts))
                outcomes["reply"].append((utterance is not None, seconds))
        refused = mode == "json_schema" and not sim.backend.structured
        spelling = sim.backend.spelling
    result: dict[str, Any] = {"refused_response_format": refused, "spelling": spelling}
    for step, rows in outcomes.items():
        seconds = sorted(s for _, s in rows)
        parsed = sum(ok for ok, _ in rows)
        result[step] = {"answers": len(rows), "parsed": parsed, "rate": parsed / len(rows),
                        "mean_s": statistics.fmean(seconds), "p50_s": statistics.median(seconds),
                        "p90_s": seconds[min(len(seconds) - 1, math.ceil(0.9 * len(seconds)) - 1)]}
    return result


def _measured(mode: str, profiles) -> dict[str, Any]:
    """measure(), or {"error": why} when the mode could not run (the server went away, refused the
    key, ...): the other modes' results are kept and printed."""
    try:
        return asyncio.run(measure(mode, profiles))
    except SimulatorUnavailableError as e:
        return {"error": str(e)}


def main(argv):
    del argv
    absl_logging.set_verbosity(absl_logging.WARNING)  # not every HTTP request; the fallback warning stays
    for mode in _MODES.value:
        if mode not in STRUCTURED_OUTPUTS:
            raise app.UsageError(f"--modes: {mode!r} is not one of {STRUCTURED_OUTPUTS}")
    profiles = _profiles(_PROFILES.value)
    results = {"base_url": _BASE_URL.value, "model": _MODEL.value, "profiles": [p.id for p in profiles],
               "modes": {mode: _measured(mode, profiles) for mode in _MODES.value}}
    print(f"simulator {_MODEL.value} at {_BASE_URL.value}, {len(profiles)} profiles")
    print("| mode | step | answers | parsed | parse rate | mean s | p50 s | p90 s |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, r in results["modes"].items():
        if "error" in r:
            print(f"| {mode} | could not run: {r['error']} |")
            continue
        label = mode + (" (refused: text)" if r["refused_response_format"] else
                        f" ({r['spelling']})" if r["spelling"] not in (None, mode) else "")
        for step in STEPS:
            s = r[step]
            print(f"| {label} | {step} | {s['answers']} | {s['parsed']} | {100 * s['rate']:.0f}% | "
                  f"{s['mean_s']:.2f} | {s['p50_s']:.2f} | {s['p90_s']:.2f} |")
    if _OUT.value:
        pathlib.Path(_OUT.value).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    app.run(main)

"""The simulated user's time per request in the plan's step estimate (planner.rollout_time.Simulator):
a served simulator's figure is config.simulator.latency_s (its default a served 72B model's
measured rate, configs/simulator.py), at most config.simulator.max_concurrency requests in flight;
the embedded user answers in the trainer's own process, one request at a time, in the time its
judge and its templates take on this host (measured here: `embedded_seconds`).
"""

from __future__ import annotations

import functools
import time

from rlver_jax.simulator.embedded import EmbeddedBackend
from rlver_jax.simulator.profiles import load_profiles
from rlver_jax.simulator.state import DialogueState, EmotionRules
from rlver_jax.train.planner.rollout_time import Simulator
from rlver_jax.train.spec import RunSpec

SERVED = ("config.simulator.latency_s (default: Qwen2.5-72B-Instruct at 29.9 tokens/s a request on 4 A100s, vLLM, "
          "Qwen2.5's speed benchmark; 502- and 395-token answers, docs/fidelity.md)")
# A policy reply of a usual length for the embedded user's judge (its cost grows with the text).
_REPLY = ("That sounds really hard, and it makes sense that you feel worn out after everything this week. "
          "What part of it is weighing on you the most right now? I'm here to listen.")


@functools.cache
def embedded_seconds(repeats: int = 20) -> float:
    """Seconds the embedded user takes per request on this host (its judge and its reply template
    over two requests, a turn's emotion step and reply step), the fastest of `repeats` turns."""
    import asyncio

    profile = next(p for p in load_profiles() if p.language == "en")
    rules = EmotionRules()
    state = DialogueState(profile=profile, rules=rules, language="en", difficulty="vanilla",
                          emotion=rules.initial_emotion, emotions=(rules.initial_emotion,),
                          history=({"role": "user", "content": "I had a rough week."},), records=())
    backend = EmbeddedBackend()

    async def turns() -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            await backend.judge(state, _REPLY)
            await backend.speak(state, "")
            best = min(best, time.perf_counter() - t0)
        return best

    return asyncio.run(turns()) / 2


def simulator(spec: RunSpec) -> Simulator:
    """The run's simulated user as the estimate times it (module docstring)."""
    s = spec.simulator
    if s.row.served:
        return Simulator(s.latency_s, s.client.max_concurrency, SERVED)
    return Simulator(embedded_seconds(), 1, f"the {s.backend} user, in the trainer's process one request at a time, "
                                            "its judge and template measured on this host")

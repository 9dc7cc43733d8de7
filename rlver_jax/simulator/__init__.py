"""The sentient user simulator: simulated users whose emotion is the reward.

Usage (rollout and evaluation code):

    from rlver_jax import simulator

    settings = simulator.SimulatorSettings.from_config(config.simulator)  # read and checked once
    simulator.check_endpoint(settings)                  # at startup: fail fast if it is down
    sim = simulator.build_simulator(settings)           # the row of config.simulator.backend (backends.py)
    profiles = simulator.load_profiles(path)            # None -> the project's shipped profiles
    async with sim:
        state = await sim.start(profile)                # optional 2nd arg: EmotionRules
        while not state.done:
            reply = ...                                 # the policy's visible reply text
            state = await sim.respond(state, reply)     # emotion step, end checks, reply step

Run many dialogues at once with asyncio.gather over start/respond; the openai backend bounds
in-flight requests with one bound that adapts to the server's pace, at most
config.simulator.max_concurrency (rlver_jax.llm_client, rlver_jax.inflight).

DialogueState (frozen, JSON via to_dict()/DialogueState.from_dict()):
  emotion      current emotion (int; capped at rules.ceiling, not clipped below)
  emotions     trajectory: the initial emotion, then one entry per judged turn
  history      [{"role": "user"|"assistant", "content": str}] from the policy's point of view;
               starts with the user's first line (`first_talk`, or the simulator's opening)
  done, end_reason  "goodbye" | "success" | "failure" | "turn_limit" | "simulator_error"
  records      TurnRecord per turn (0 = opening): reply, thoughts, proposed and applied change,
               emotion, band, utterance, raw simulator answers, attempts, error
  turns, band, profile, rules, language, difficulty, error
Reward for RL: max(state.emotion, 0) / 100. A dialogue with end_reason "simulator_error" has
no valid reward: keep it in transcripts, leave it out of training and scoring.

Errors: SimulatorUnavailableError (server refusing, or failing after retries; stop the run; a
llm_client.EndpointUnavailableError), SimulatorOutageError (one, down or throttled past
config.simulator.outage_budget_s: stop, resumable, exit 75), ProfileError (bad profile file: names
file, line and field).

Modules: profiles (loading, validation, language), templates + prompts/ (the LLM prompts, zh/en,
vanilla/challenging), parsing (tolerant answer parsing, label neutralising), patterns (regexes
shared by several modules), state (DialogueState, TurnRecord, EmotionRules), settings
(SimulatorSettings), agent (the emotion state machine and Simulator), interface (the backend and
transport interfaces), backends (the backend table: one row per config.simulator.backend),
llm_user (an LLM plays the user: prompts, parsing, retries, cache, probe) over openai_transport
(an OpenAI-compatible server), embedded (a deterministic stand-in for demos and tests, not a
benchmark) with its judge calibrated on SAGE's released results (judge, judge_features,
judge_lexicon + lexicon, judge_weights, judge_fit), sage_results and agreement (how closely a
simulator judges like SAGE's), cache (record/replay), factory.

The names above are imported lazily (PEP 562), each from its module on first use, so importing
one module (rlver_jax.simulator.profiles, say) does not pull in the openai client and httpx.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

_MODULE_OF = {  # public name -> the module that defines it
    "Simulator": "agent", "is_goodbye": "agent",
    "Backend": "interface", "EmotionJudgement": "interface", "SimulatorOutputError": "interface",
    "SimulatorUnavailableError": "interface", "SimulatorOutageError": "interface", "Utterance": "interface",
    "CacheMissError": "cache",
    "build_simulator": "factory", "check_endpoint": "factory",
    "DEFAULT_PROFILES": "profiles", "Profile": "profiles", "ProfileError": "profiles",
    "detect_language": "profiles", "load_profiles": "profiles",
    "SimulatorSettings": "settings",
    "END_REASONS": "state", "DialogueState": "state", "EmotionRules": "state", "TurnRecord": "state",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    """A public name from its module, or a submodule (`simulator.agent`), imported on first use."""
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

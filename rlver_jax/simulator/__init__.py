"""The sentient user simulator: simulated users whose emotion is the reward.

Usage (rollout and evaluation code):

    from rlver_jax import simulator

    settings = simulator.SimulatorSettings.from_config(config.simulator)  # read and checked once
    simulator.check_endpoint(settings)                  # at startup: fail fast if it is down
    sim = simulator.build_simulator(settings)           # backend chosen by config.simulator.backend
    profiles = simulator.load_profiles(path)            # None -> the project's shipped profiles
    async with sim:
        state = await sim.start(profile)                # optional 2nd arg: EmotionRules
        while not state.done:
            reply = ...                                 # the policy's visible reply text
            state = await sim.respond(state, reply)     # emotion step, end checks, reply step

Run many dialogues at once with asyncio.gather over start/respond; the openai backend bounds
in-flight requests with one semaphore (config.simulator.max_concurrency; rlver_jax.llm_client).

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

Errors: SimulatorUnavailableError (server down or refusing after retries; stop the run; a
llm_client.EndpointUnavailableError), ProfileError (bad profile file: names file, line and field).

Modules: profiles (loading, validation, language), templates + prompts/ (the LLM prompts, zh/en,
vanilla/challenging), parsing (tolerant answer parsing, label neutralising), patterns (regexes
shared by several modules), state (DialogueState, TurnRecord, EmotionRules), settings
(SimulatorSettings), agent (the emotion state machine and Simulator), backend (the backend
interface), openai_backend, embedded (a deterministic stand-in for demos and tests, not a
benchmark), cache (record/replay), factory.
"""

from rlver_jax.simulator.agent import Simulator, is_goodbye
from rlver_jax.simulator.backend import (Backend, EmotionJudgement, SimulatorOutputError,
                                         SimulatorUnavailableError, Utterance)
from rlver_jax.simulator.cache import CacheMissError
from rlver_jax.simulator.factory import build_simulator, check_endpoint
from rlver_jax.simulator.profiles import (DEFAULT_PROFILES, Profile, ProfileError,
                                          detect_language, load_profiles)
from rlver_jax.simulator.settings import SimulatorSettings
from rlver_jax.simulator.state import END_REASONS, DialogueState, EmotionRules, TurnRecord

__all__ = [
    "Backend", "CacheMissError", "DEFAULT_PROFILES", "DialogueState", "END_REASONS",
    "EmotionJudgement", "EmotionRules", "Profile", "ProfileError", "Simulator",
    "SimulatorOutputError", "SimulatorSettings", "SimulatorUnavailableError", "TurnRecord",
    "Utterance", "build_simulator", "check_endpoint", "detect_language", "is_goodbye",
    "load_profiles",
]

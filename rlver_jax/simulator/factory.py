"""Building a Simulator from SimulatorSettings, and the start-up endpoint check."""

from __future__ import annotations

from rlver_jax.llm_client import EndpointUnavailableError, check_chat_endpoint
from rlver_jax.simulator.agent import Simulator
from rlver_jax.simulator.backend import Backend, SimulatorUnavailableError
from rlver_jax.simulator.embedded import EmbeddedBackend
from rlver_jax.simulator.openai_backend import OpenAIBackend
from rlver_jax.simulator.settings import SimulatorSettings

_START_HINT = ("Start one with `bash launch/serve_simulator.sh --model-path <model dir> --port <port>` "
               "(it prints the base URL), use --config.simulator.backend=embedded for a CPU demo")


def build_simulator(settings: SimulatorSettings) -> Simulator:
    """The simulator `settings` describe (SimulatorSettings.from_config(config.simulator))."""
    backend: Backend = OpenAIBackend(settings) if settings.backend == "openai" else EmbeddedBackend()
    return Simulator(backend, rules=settings.rules, difficulty=settings.difficulty,
                     language=settings.language)


def check_endpoint(settings: SimulatorSettings) -> None:
    """Before a run: one request (GET /models) to the simulator; raises at once if it cannot serve.

    Checks that the server answers, accepts the key and serves the model (when it lists its
    models). Nothing to check for the embedded backend or when replaying a recorded cache. The
    error names the URL and says how to start a server.
    """
    if settings.backend != "openai" or settings.cache_replay_only:
        return
    try:
        check_chat_endpoint(settings.client, start_hint=_START_HINT)
    except EndpointUnavailableError as e:
        raise SimulatorUnavailableError(f"simulator: {e}") from e

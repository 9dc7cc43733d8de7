"""Building a Simulator from SimulatorSettings (its backend by the row of backends.BACKENDS), and
the start-up endpoint check."""

from __future__ import annotations

from rlver_jax.llm_client import EndpointUnavailableError, OutageError, check_chat_endpoint
from rlver_jax.simulator.agent import Simulator
from rlver_jax.simulator.interface import SimulatorOutageError, SimulatorUnavailableError
from rlver_jax.simulator.settings import SimulatorSettings

_START_HINT = ("Start one with `bash launch/serve_simulator.sh --model-path <model dir> --port <port>` "
               "(it prints the base URL), use --config.simulator.backend=embedded for a CPU demo")


def build_simulator(settings: SimulatorSettings) -> Simulator:
    """The simulator `settings` describe (SimulatorSettings.from_config(config.simulator))."""
    return Simulator(settings.row.build(settings.llm, settings.client), rules=settings.rules,
                     difficulty=settings.difficulty, language=settings.language)


def check_endpoint(settings: SimulatorSettings, *, wait: bool = False) -> None:
    """Before a run: one request (GET /models) to a served simulator; raises at once if it cannot serve.

    Checks that the server answers, accepts the key and serves the model (when it lists its
    models). Nothing to check for a backend that is not served or when replaying a recorded cache.
    The error names the URL and says how to start a server. With `wait` (a run started before,
    rerun after an outage) a simulator still down is waited for up to config.simulator.outage_budget_s
    (then SimulatorOutageError: exit status 75, as the run that stopped).
    """
    if not settings.row.served or settings.llm.cache_replay_only:
        return
    try:
        check_chat_endpoint(settings.client, start_hint=_START_HINT, wait=wait)
    except OutageError as e:
        raise SimulatorOutageError(f"simulator: {e}") from e
    except EndpointUnavailableError as e:
        raise SimulatorUnavailableError(f"simulator: {e}") from e

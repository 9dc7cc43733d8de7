"""Building a Simulator from the `config.simulator` section, and the startup endpoint check."""

from __future__ import annotations

from ml_collections import config_dict

from rlver_jax.endpoint import EndpointUnavailableError, check_chat_endpoint
from rlver_jax.simulator.agent import EmotionRules, Simulator
from rlver_jax.simulator.backend import Backend, SimulatorUnavailableError
from rlver_jax.simulator.embedded import EmbeddedBackend
from rlver_jax.simulator.openai_backend import OpenAIBackend
from rlver_jax.simulator.templates import DIFFICULTIES, LANGUAGES

BACKENDS = ("openai", "embedded")


def build_simulator(cfg: config_dict.ConfigDict) -> Simulator:
    """The simulator described by `config.simulator` (see configs/simulator.py)."""
    if cfg.backend not in BACKENDS:
        raise ValueError(f"config.simulator.backend={cfg.backend!r}: use one of {BACKENDS}")
    if cfg.difficulty not in DIFFICULTIES:
        raise ValueError(
            f"config.simulator.difficulty={cfg.difficulty!r}: use one of {DIFFICULTIES}")
    if cfg.language not in ("",) + LANGUAGES:
        raise ValueError(
            f"config.simulator.language={cfg.language!r}: use '' (each profile's own), 'zh' or "
            "'en'")
    backend: Backend = OpenAIBackend(cfg) if cfg.backend == "openai" else EmbeddedBackend()
    return Simulator(backend, rules=EmotionRules.from_config(cfg), difficulty=cfg.difficulty,
                     language=cfg.language)


def check_endpoint(cfg: config_dict.ConfigDict) -> None:
    """Before a run: one request (GET /models) to the simulator; raises at once if it cannot serve.

    Checks that the server answers, accepts the key and serves `cfg.model` (when it lists its
    models). Nothing to check for the embedded backend or when replaying a recorded cache. The
    error names the URL and says how to start a server.
    """
    if cfg.backend != "openai" or cfg.cache_replay_only:
        return
    hint = ("Start one with `bash launch/serve_simulator.sh --model-path <model dir> --port <port>` "
            "(it prints the base URL), use --config.simulator.backend=embedded for a CPU demo")
    try:
        check_chat_endpoint(cfg.base_url, cfg.model, cfg.api_key_env, "--config.simulator.", start_hint=hint,
                            timeout_s=min(cfg.timeout_s, 30.0))
    except EndpointUnavailableError as e:
        raise SimulatorUnavailableError(f"simulator: {e}") from e

"""Building a Simulator from the `config.simulator` section, and the startup endpoint check."""

from __future__ import annotations

import openai
from ml_collections import config_dict

from rlver_jax.simulator.agent import EmotionRules, Simulator
from rlver_jax.simulator.backend import Backend, SimulatorUnavailableError
from rlver_jax.simulator.embedded import EmbeddedBackend
from rlver_jax.simulator.openai_backend import OpenAIBackend, api_key_from_env
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
    url = cfg.base_url
    client = openai.OpenAI(base_url=url, api_key=api_key_from_env(cfg.api_key_env),
                           timeout=min(cfg.timeout_s, 30.0), max_retries=0)
    try:
        served = [m.id for m in client.models.list()]
    except openai.APIConnectionError as e:
        raise SimulatorUnavailableError(
            f"No simulator answers at {url} ({e.__class__.__name__}: {e}). Start one with\n"
            "  bash launch/serve_simulator.sh --model-path <hf-model-or-dir> --port <port>\n"
            "(it prints the base URL), or set --config.simulator.base_url to a running "
            "OpenAI-compatible server, or use --config.simulator.backend=embedded for a CPU demo."
        ) from e
    except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
        raise SimulatorUnavailableError(
            f"The simulator server at {url} rejected the API key (HTTP {e.status_code}). Put the "
            f"key in the environment variable ${cfg.api_key_env} "
            "(config.simulator.api_key_env names it)."
        ) from e
    except openai.NotFoundError:
        return  # up, but does not list models: nothing more to check
    except openai.APIStatusError as e:
        raise SimulatorUnavailableError(
            f"The simulator server at {url} answered HTTP {e.status_code}: {e.message}"
        ) from e
    finally:
        client.close()
    if served and cfg.model not in served:
        raise SimulatorUnavailableError(
            f"The simulator server at {url} serves {served}, not {cfg.model!r}. Set "
            "--config.simulator.model to one of those (or start the server with "
            "--served-model-name)."
        )

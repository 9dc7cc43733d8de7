"""SimulatorSettings: the `config.simulator` section (configs/simulator.py) read and checked once,
then handed to the factory, the backends and the start-up check."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Collection

from ml_collections import config_dict

from rlver_jax.checks import build_all, check_ranges, named
from rlver_jax.llm_client import ClientSettings
from rlver_jax.simulator.state import EmotionRules
from rlver_jax.simulator.templates import DIFFICULTIES, LANGUAGES

BACKENDS = ("openai", "embedded")
STRUCTURED_OUTPUTS = ("off", "json_schema")
_MIN_PROMPT_TOKENS = 1024  # below this not even the instructions and one reply fit
# The fields of config.simulator only a served simulator reads (its endpoint, sampling, answer format,
# prompt budget and answer cache): the embedded backend reads the emotion rules, difficulty and language.
SERVED_ONLY = ("base_url", "model", "api_key_env", "timeout_s", "max_concurrency", "max_retries", "backoff_initial_s",
               "backoff_max_s", "temperature", "max_tokens", "malformed_retries", "structured_output",
               "max_prompt_tokens", "max_utterance_chars", "cache_dir", "cache_replay_only")


@dataclasses.dataclass(frozen=True)
class SimulatorSettings:
    backend: str  # one of BACKENDS
    client: ClientSettings  # the openai backend's endpoint
    temperature: float  # simulator sampling temperature
    max_tokens: int  # per simulator answer
    malformed_retries: int  # fresh samples after an answer breaks the format; then simulator_error
    structured_output: str  # one of STRUCTURED_OUTPUTS
    max_prompt_tokens: int  # estimated prompt tokens per request (templates.prompt_tokens)
    max_utterance_chars: int  # the simulated user's words are cut here
    difficulty: str  # one of templates.DIFFICULTIES
    language: str  # "" = each profile's own, or one of templates.LANGUAGES
    cache_dir: str  # record/replay directory for simulator answers; "" = off
    cache_replay_only: bool  # answer only from cache_dir, never call the server
    rules: EmotionRules

    @classmethod
    def from_config(cls, cfg: config_dict.ConfigDict, *, given: Collection[str] = ()) -> SimulatorSettings:
        """Reads the section; one ValueError names every bad config.simulator field. `given`: the
        section's fields the command line set (e.g. {"base_url"}), each refused where the backend
        ignores it (`check_read`)."""
        own = {k: cfg[k] for k in _OWN_FIELDS}
        _, _, client, rules = build_all(
            lambda: _check_fields(types.SimpleNamespace(**own)),
            lambda: check_read(cfg.backend, given),
            lambda: ClientSettings.from_config(cfg, name="simulator", flag_prefix="--config.simulator."),
            lambda: EmotionRules.from_config(cfg))
        return cls(**own, client=client, rules=rules)


def check_read(backend: str, given: Collection[str]) -> None:
    """Refuse fields of config.simulator set on the command line (`given`) that `backend` ignores, so
    that a server's URL given to a preset of the embedded simulator is not silently unused."""
    unread = [f for f in SERVED_ONLY if f in given] if backend == "embedded" else []
    if unread:
        flags = " ".join(f"--config.simulator.{f}" for f in unread)
        raise ValueError(f"{flags} set, but --config.simulator.backend='embedded' (the rule-based simulator) reads "
                         f"no server: add --config.simulator.backend=openai to use the served simulator, or drop "
                         f"{flags}")


# The simulator's own fields of config.simulator (not its endpoint's, not the emotion rules').
_OWN_FIELDS = ("backend", "temperature", "max_tokens", "malformed_retries", "structured_output", "max_prompt_tokens",
               "max_utterance_chars", "difficulty", "language", "cache_dir", "cache_replay_only")


def _check_fields(f: types.SimpleNamespace) -> None:
    """The simulator's own fields (`_OWN_FIELDS`), each named as config.simulator's."""
    if f.backend not in BACKENDS:
        raise ValueError(f"config.simulator.backend={f.backend!r}: use one of {BACKENDS}")
    if f.difficulty not in DIFFICULTIES:
        raise ValueError(f"config.simulator.difficulty={f.difficulty!r}: use one of {DIFFICULTIES}")
    if f.language not in ("",) + LANGUAGES:
        raise ValueError(f"config.simulator.language={f.language!r}: use '' (each profile's own), 'zh' or 'en'")
    if f.cache_replay_only and not f.cache_dir:
        raise ValueError("config.simulator.cache_replay_only needs config.simulator.cache_dir")
    if f.structured_output not in STRUCTURED_OUTPUTS:
        raise ValueError(f"config.simulator.structured_output={f.structured_output!r}: use one of "
                         f"{STRUCTURED_OUTPUTS}")
    if f.max_prompt_tokens < _MIN_PROMPT_TOKENS:
        raise ValueError(f"config.simulator.max_prompt_tokens={f.max_prompt_tokens} is too small: use "
                         f"{_MIN_PROMPT_TOKENS} or more (and at most the server's context minus max_tokens)")
    check_ranges(named(f, "config.simulator.", ("temperature", "max_tokens", "malformed_retries",
                                                "max_utterance_chars")),
                 lowest={"temperature": 0, "max_tokens": 1, "malformed_retries": 0, "max_utterance_chars": 1})

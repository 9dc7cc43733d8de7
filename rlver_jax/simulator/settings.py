"""SimulatorSettings: the `config.simulator` section (configs/simulator.py) read and checked once,
then handed to the factory, the backends and the start-up check."""

from __future__ import annotations

import dataclasses

from ml_collections import config_dict

from rlver_jax.checks import build_all, check_ranges, named
from rlver_jax.llm_client import ClientSettings
from rlver_jax.simulator.state import EmotionRules
from rlver_jax.simulator.templates import DIFFICULTIES, LANGUAGES

BACKENDS = ("openai", "embedded")
STRUCTURED_OUTPUTS = ("off", "json_schema")
_MIN_PROMPT_TOKENS = 1024  # below this not even the instructions and one reply fit


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
    def from_config(cls, cfg: config_dict.ConfigDict) -> SimulatorSettings:
        """Reads the section; one ValueError names every bad config.simulator field."""
        _, client, rules = build_all(
            lambda: _check_section(cfg),
            lambda: ClientSettings.from_config(cfg, name="simulator", flag_prefix="--config.simulator."),
            lambda: EmotionRules.from_config(cfg))
        return cls(backend=cfg.backend, client=client, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                   malformed_retries=cfg.malformed_retries, structured_output=cfg.structured_output,
                   max_prompt_tokens=cfg.max_prompt_tokens, max_utterance_chars=cfg.max_utterance_chars,
                   difficulty=cfg.difficulty, language=cfg.language,
                   cache_dir=cfg.cache_dir, cache_replay_only=cfg.cache_replay_only, rules=rules)


def _check_section(cfg: config_dict.ConfigDict) -> None:
    """The simulator's own fields of `cfg` (not its endpoint's, not the emotion rules')."""
    if cfg.backend not in BACKENDS:
        raise ValueError(f"config.simulator.backend={cfg.backend!r}: use one of {BACKENDS}")
    if cfg.difficulty not in DIFFICULTIES:
        raise ValueError(f"config.simulator.difficulty={cfg.difficulty!r}: use one of {DIFFICULTIES}")
    if cfg.language not in ("",) + LANGUAGES:
        raise ValueError(f"config.simulator.language={cfg.language!r}: use '' (each profile's own), 'zh' or 'en'")
    if cfg.cache_replay_only and not cfg.cache_dir:
        raise ValueError("config.simulator.cache_replay_only needs config.simulator.cache_dir")
    if cfg.structured_output not in STRUCTURED_OUTPUTS:
        raise ValueError(f"config.simulator.structured_output={cfg.structured_output!r}: use one of "
                         f"{STRUCTURED_OUTPUTS}")
    if cfg.max_prompt_tokens < _MIN_PROMPT_TOKENS:
        raise ValueError(f"config.simulator.max_prompt_tokens={cfg.max_prompt_tokens} is too small: use "
                         f"{_MIN_PROMPT_TOKENS} or more (and at most the server's context minus max_tokens)")
    check_ranges(named(cfg, "config.simulator.", ("temperature", "max_tokens", "malformed_retries",
                                                  "max_utterance_chars")),
                 lowest={"temperature": 0, "max_tokens": 1, "malformed_retries": 0, "max_utterance_chars": 1})

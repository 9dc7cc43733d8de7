"""SimulatorSettings: the `config.simulator` section (configs/simulator.py) read and checked once,
then handed to the factory, the backends and the start-up check."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from ml_collections import config_dict

from rlver_jax.checks import build_all
from rlver_jax.llm_client import ClientSettings
from rlver_jax.simulator import backends
from rlver_jax.simulator.llm_user import LLMUserSettings
from rlver_jax.simulator.state import EmotionRules
from rlver_jax.simulator.templates import DIFFICULTIES, LANGUAGES


@dataclasses.dataclass(frozen=True)
class SimulatorSettings:
    backend: str  # a key of backends.BACKENDS
    client: ClientSettings  # where a served backend answers (config.simulator's base_url, model, ...)
    llm: LLMUserSettings  # how an LLM user asks: sampling, answer format, retries, prompt budget, cache
    difficulty: str  # one of templates.DIFFICULTIES
    language: str  # "" = each profile's own, or one of templates.LANGUAGES
    rules: EmotionRules
    latency_s: float = 15.0  # a served simulator's seconds per request, for the planner (config.simulator.latency_s)

    @property
    def row(self) -> backends.BackendRow:
        """The backend's row of the table (backends.BACKENDS)."""
        return backends.BACKENDS[self.backend]

    def describe(self) -> str:
        """What plays the user, by its row: "served (openai backend) at URL, model 'NAME'" (at
        "replayed from DIR" when replaying a cache); a backend that is not served, its summary."""
        row = self.row
        words = row.summary
        if row.served:
            words += " at " + ("replayed from " + self.llm.cache_dir if self.llm.cache_replay_only
                               else self.client.base_url)
        if "model" in row.reads:
            words += f", model {self.client.model!r}"
        return words

    @classmethod
    def from_config(cls, cfg: config_dict.ConfigDict, *, given: Collection[str] = ()) -> SimulatorSettings:
        """Reads the section; one ValueError names every bad config.simulator field. `given`: the
        section's fields the command line set (e.g. {"base_url"}), each refused where the backend
        ignores it (`check_read`)."""
        _, _, client, llm, rules = build_all(
            lambda: _check_fields(cfg.backend, cfg.difficulty, cfg.language, cfg.latency_s),
            lambda: check_read(cfg.backend, given),
            lambda: ClientSettings.from_config(cfg, name="simulator", flag_prefix="--config.simulator."),
            lambda: LLMUserSettings.from_config(cfg),
            lambda: EmotionRules.from_config(cfg))
        return cls(backend=cfg.backend, client=client, llm=llm, difficulty=cfg.difficulty, language=cfg.language,
                   rules=rules, latency_s=cfg.latency_s)


def check_read(backend: str, given: Collection[str]) -> None:
    """Refuse fields of config.simulator set on the command line (`given`) that `backend` does not
    read (its row's `reads`), so that a server's URL given to a preset of the embedded simulator is
    not silently unused. An unknown backend is left to `_check_fields`."""
    if backend not in backends.BACKENDS:
        return
    some_read = frozenset().union(*(r.reads for r in backends.BACKENDS.values()))
    unread = sorted(f for f in given if f in some_read - backends.BACKENDS[backend].reads)
    if unread:
        flags, them = " ".join(f"--config.simulator.{f}" for f in unread), "it" if len(unread) == 1 else "them"
        readers = " or ".join(f"--config.simulator.backend={name}"
                              for name in backends.BACKENDS.where(lambda r: set(unread) <= r.reads))
        raise ValueError(f"{flags} set, but --config.simulator.backend={backend!r} does not read {them}: add "
                         f"{readers or 'a backend that does'} to use {them}, or drop {flags}")


def _check_fields(backend: str, difficulty: str, language: str, latency_s: float) -> None:
    """The fields every backend reads, each named as config.simulator's."""
    backends.BACKENDS.row(backend)
    if not 0 <= latency_s < float("inf"):
        raise ValueError(f"config.simulator.latency_s={latency_s}: use a finite number of seconds >= 0")
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"config.simulator.difficulty={difficulty!r}: use one of {DIFFICULTIES}")
    if language not in ("",) + LANGUAGES:
        raise ValueError(f"config.simulator.language={language!r}: use '' (each profile's own), 'zh' or 'en'")

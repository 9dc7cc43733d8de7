"""The simulator backend table: what each `config.simulator.backend` is, as data.

A row says how the backend is built, which fields of config.simulator it reads beyond every
backend's own (difficulty, language and the emotion rules), whether it is served (it answers at
config.simulator.base_url: the start-up check asks its server, the protocol card records the model
ids that server lists and its URL), and how the training banner and the protocol card name it. The
settings (a field the backend does not read, set on the command line, is refused), the factory,
the banner, the protocol card, the evaluation's run line and panels of simulators read the row,
never the name: adding a backend is its module plus one row here.

Most backends are an LLM user (llm_user.LLMUser: prompts, parsing, retries, cache, the
structured-output probe) over a transport (interface.Transport: `complete(messages,
response_format)`); such a backend is its transport's module plus a row whose `build` is
`llm_user(ItsTransport)`. A JAX simulator on the trainer's mesh or a served judge is one of those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rlver_jax.llm_client import ClientSettings
from rlver_jax.simulator.embedded import EmbeddedBackend
from rlver_jax.simulator.interface import Backend, Transport
from rlver_jax.simulator.llm_user import LLMUser, LLMUserSettings
from rlver_jax.simulator.openai_transport import OpenAITransport
from rlver_jax.table import Table

# config.simulator's fields that change how a served simulator's answers are fetched, not what they
# are: a resumed run may change them (train/spec.FREE), an evaluation keeps its own under a training
# run's settings (eval/spec.like_training), and setup.json does not record them.
TRANSPORT = frozenset({"base_url", "api_key_env", "timeout_s", "max_concurrency", "max_retries", "backoff_initial_s",
                       "backoff_max_s", "outage_budget_s", "malformed_retries", "cache_dir", "cache_replay_only",
                       "latency_s"})
# What the planner reads of a served simulator (launch/plan.py's step estimate): seconds per request.
PLANNING = frozenset({"latency_s"})
# Where a served model answers (llm_client.ClientSettings): base_url, model, api_key_env, timeout_s, ...
ENDPOINT_FIELDS = frozenset(f.name for f in dataclasses.fields(ClientSettings)) - {"name", "flag_prefix"}
# How an LLM user asks: sampling, answer format, retries, prompt budget, answer cache.
LLM_USER_FIELDS = frozenset(f.name for f in dataclasses.fields(LLMUserSettings))

Build = Callable[[LLMUserSettings, ClientSettings], Backend]


@dataclasses.dataclass(frozen=True)
class BackendRow:
    build: Build  # the backend of one simulator, from config.simulator's LLM-user and endpoint settings
    reads: frozenset[str]  # config.simulator's fields it reads beyond every backend's; the others are refused
    served: bool  # it answers at config.simulator.base_url (an OpenAI-compatible server, rlver_jax.llm_client)
    summary: str  # what plays the user, in the banner's words ("served (openai backend)")
    card_model: str = ""  # the protocol card's simulator.model where it reads no config.simulator.model


def llm_user(transport: Callable[[ClientSettings], Transport]) -> Build:
    """`build` of an LLM user speaking through the transport `transport` makes."""
    return lambda llm, client: LLMUser(llm, transport(client))


BACKENDS: Table[BackendRow] = Table("config.simulator.backend", {
    # An LLM behind an OpenAI-compatible API (SGLang, vLLM, any provider): launch/serve_simulator.sh
    "openai": BackendRow(build=llm_user(OpenAITransport), reads=ENDPOINT_FIELDS | LLM_USER_FIELDS | PLANNING,
                         served=True,
                         summary="served (openai backend)"),
    # Deterministic rules, no network: a stand-in for demos and tests, not a benchmark
    "embedded": BackendRow(build=lambda llm, client: EmbeddedBackend(), reads=frozenset(), served=False,
                           summary="embedded (a stand-in whose judge is fitted on SAGE's results, "
                                   "rlver_jax/simulator/embedded.py; no server)",
                           card_model="embedded judge fitted on SAGE's results"),
}, summary=lambda r: r.summary)


def first_served() -> str:
    """The first served backend of the table: what a panel member given as MODEL@URL plays under,
    and what the banner of a run without a server names."""
    return BACKENDS.where(lambda r: r.served)[0]

"""Policies that write one dialogue turn for a batch of dialogues.

`JaxPolicy` samples with rlver_jax.sampling on the trainer's own parameters (token ids and
log-probs out, for training). `OpenAIPolicy` asks any OpenAI-compatible chat endpoint (text out,
for scoring served or API models on the same footing).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any, Protocol

import jax

from rlver_jax import sampling
from rlver_jax.buckets import LENGTH_BUCKETS
from rlver_jax.chat import ChatTokens
from rlver_jax.llm_client import ChatClient, ClientSettings
from rlver_jax.models.config import Qwen2Config
from rlver_jax.rollout.kv_sessions import KVSessions
from rlver_jax.sampling import SamplingSettings


@dataclasses.dataclass(frozen=True)
class TurnRequest:
    prompt_ids: list[int] | None  # the ChatML history plus "<|im_start|>assistant\n" (token policies)
    messages: list[dict[str, str]]  # the same history as messages (text policies)
    max_new_tokens: int
    # Identity of the dialogue, so a policy can keep its KV cache from turn to turn: `session`
    # (a group of dialogues generated together), `slot` (its row there), `episode` (unique id).
    session: int = 0
    slot: int = 0
    episode: int = 0


@dataclasses.dataclass(frozen=True)
class PolicyTurn:
    text: str  # the whole sampled turn as text (thinking included), without the stop token
    token_ids: list[int] | None = None  # sampled ids, ending with the stop id when `stopped`
    logprobs: list[float] | None = None  # log-probs of token_ids under the model (temperature 1)
    stopped: bool = True  # ended by a stop token (False: cut by the token budget)


class Policy(Protocol):
    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        """One turn for each request (all of one session)."""

    def release(self, session: int) -> None:
        """The dialogues of `session` are over: drop anything kept for them."""


class JaxPolicy:
    """Samples on parameters the trainer publishes; one device call at a time.

    Generation runs in a worker thread so the asyncio loop keeps serving simulator requests of
    other dialogues meanwhile. Each call's key is fold_in(rng, call index): a batch of rollouts
    is reproducible from (rng, the order of calls), which is fixed with one pipeline group.
    With settings.cache_slots > 0 each dialogue's KV cache is kept between turns (kv_sessions).
    """

    def __init__(self, model_cfg: Qwen2Config, chat_tokens: ChatTokens, settings: SamplingSettings,
                 params: Any, rng: jax.Array, version: int = 0):
        self.model_cfg = model_cfg
        self.chat = chat_tokens
        self.stop_ids = (chat_tokens.im_end, chat_tokens.end_of_text)
        # vocab_limit: never sample the embedding's rows past the tokenizer (Qwen2.5 pads 151,665 to 151,936).
        self.settings = dataclasses.replace(settings, stop_ids=self.stop_ids, pad_id=chat_tokens.end_of_text,
                                            vocab_limit=len(chat_tokens.tokenizer))
        self._params, self.version = params, version
        self._rng, self._calls = rng, 0
        self._device_lock = threading.Lock()
        self._sessions = KVSessions(model_cfg, settings.cache_slots, chat_tokens.end_of_text)

    def set_params(self, params: Any, version: int, rng: jax.Array | None = None) -> None:
        """Point the sampler at new parameters (no copy) and optionally reseed. Cached keys and
        values of earlier turns were computed with the old parameters: they are dropped."""
        with self._device_lock:
            self._params, self.version = params, version
            self._sessions.clear()
            if rng is not None:
                self._rng, self._calls = rng, 0

    def _generate(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        with self._device_lock:
            key = jax.random.fold_in(self._rng, self._calls)
            self._calls += 1
            if self.settings.cache_slots:
                out = self._generate_with_sessions(requests, key)
            else:
                prompts = [r.prompt_ids for r in requests]
                ids, mask = sampling.pad_left(prompts, max(len(p) for p in prompts), self.chat.end_of_text)
                st = self.settings
                gen = sampling.generate(
                    self.model_cfg, self._params, ids, mask, rng=key, length_buckets=LENGTH_BUCKETS,
                    max_new_tokens=st.max_new_tokens, temperature=st.temperature, top_p=st.top_p,
                    top_k=st.top_k, stop_ids=st.stop_ids, pad_id=st.pad_id, vocab_limit=st.vocab_limit)
                tokens, lps, lengths = jax.device_get((gen.tokens, gen.model_logprobs, gen.lengths))
                out = [(tokens[b, :n].tolist(), lps[b, :n].tolist()) for b, n in enumerate(lengths)]
        turns = []
        for req, (ids, lps) in zip(requests, out):
            ids, lps = ids[:req.max_new_tokens], lps[:req.max_new_tokens]
            stopped = bool(ids) and ids[-1] in self.stop_ids
            text_ids = ids[:-1] if stopped else ids
            text = self.chat.tokenizer.decode(text_ids, skip_special_tokens=False)
            turns.append(PolicyTurn(text=text, token_ids=ids, logprobs=lps, stopped=stopped))
        return turns

    def _generate_with_sessions(self, requests: list[TurnRequest], key: jax.Array):
        """One turn for dialogues whose earlier turns are already in their rows' caches."""
        if len({r.session for r in requests}) != 1:
            raise ValueError("one act() call must hold the dialogues of one session")
        feed = self._sessions.feed(requests[0].session, [(r.slot, r.episode, r.prompt_ids) for r in requests],
                                   self.settings.max_new_tokens)
        gen, cache, fed = sampling.continue_generation(
            self.model_cfg, self._params, feed.session.cache, feed.ids, feed.mask, feed.start_positions,
            settings=self.settings, rng=key)
        tokens, lps, lengths, fed = jax.device_get((gen.tokens, gen.model_logprobs, gen.lengths, fed))
        self._sessions.commit(feed, cache, tokens, fed)
        return [(tokens[r.slot, :lengths[r.slot]].tolist(), lps[r.slot, :lengths[r.slot]].tolist())
                for r in requests]

    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        return await asyncio.to_thread(self._generate, requests)

    def release(self, session: int) -> None:
        with self._device_lock:
            self._sessions.release(session)


class OpenAIPolicy:
    """A policy served behind an OpenAI-compatible chat API (vLLM, SGLang, a provider), called
    through rlver_jax.llm_client: its timeout, retries and bound on requests in flight."""

    def __init__(self, client: ClientSettings, *, temperature: float = 0.7, max_tokens: int = 1024):
        self.client = ChatClient(client)
        self.temperature, self.max_tokens = temperature, max_tokens

    async def _one(self, req: TurnRequest) -> PolicyTurn:
        answer = await self.client.complete(req.messages, temperature=self.temperature,
                                            max_tokens=min(self.max_tokens, req.max_new_tokens))
        return PolicyTurn(text=answer.text, stopped=answer.finish_reason != "length")

    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    def release(self, session: int) -> None:
        """Nothing is kept between turns."""

    async def aclose(self) -> None:
        await self.client.aclose()


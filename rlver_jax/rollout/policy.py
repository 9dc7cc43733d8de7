"""Policies that write one dialogue turn for a batch of dialogues.

`JaxPolicy` samples with rlver_jax.sampling on the trainer's own parameters (token ids and
log-probs out, for training). `OpenAIPolicy` asks any OpenAI-compatible chat endpoint (text out,
for scoring served or API models on the same footing).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from typing import Any, Protocol

import jax
import numpy as np

from rlver_jax import sampling
from rlver_jax.chat import ChatTokens
from rlver_jax.models.config import Qwen2Config


@dataclasses.dataclass(frozen=True)
class TurnRequest:
    prompt_ids: list[int] | None  # the ChatML history plus "<|im_start|>assistant\n" (token policies)
    messages: list[dict[str, str]]  # the same history as messages (text policies)
    max_new_tokens: int


@dataclasses.dataclass(frozen=True)
class PolicyTurn:
    text: str  # the whole sampled turn as text (thinking included), without the stop token
    token_ids: list[int] | None = None  # sampled ids, ending with the stop id when `stopped`
    logprobs: list[float] | None = None  # log-probs of token_ids under the model (temperature 1)
    stopped: bool = True  # ended by a stop token (False: cut by the token budget)


class Policy(Protocol):
    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        ...


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_new_tokens: int = 512  # static per compile; requests may ask for fewer


class JaxPolicy:
    """Samples on parameters the trainer publishes; one device call at a time.

    Generation runs in a worker thread so the asyncio loop keeps serving simulator requests of
    other dialogues meanwhile. Each call's key is fold_in(rng, call index): a batch of rollouts
    is reproducible from (rng, the order of calls), which is fixed with one pipeline group.
    """

    def __init__(self, model_cfg: Qwen2Config, chat_tokens: ChatTokens, settings: SamplingSettings,
                 params: Any, rng: jax.Array, version: int = 0):
        self.model_cfg = model_cfg
        self.chat = chat_tokens
        self.settings = settings
        self._params, self.version = params, version
        self._rng, self._calls = rng, 0
        self._device_lock = threading.Lock()
        self.stop_ids = (chat_tokens.im_end, chat_tokens.end_of_text)

    def set_params(self, params: Any, version: int, rng: jax.Array | None = None) -> None:
        """Point the sampler at new parameters (no copy) and optionally reseed."""
        with self._device_lock:
            self._params, self.version = params, version
            if rng is not None:
                self._rng, self._calls = rng, 0

    def _generate(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        with self._device_lock:
            key = jax.random.fold_in(self._rng, self._calls)
            self._calls += 1
            prompts = [r.prompt_ids for r in requests]
            ids, mask = pad_left(prompts, max(len(p) for p in prompts), self.chat.end_of_text)
            gen = sampling.generate(
                self.model_cfg, self._params, ids, mask, max_new_tokens=self.settings.max_new_tokens,
                rng=key, temperature=self.settings.temperature, top_p=self.settings.top_p,
                top_k=self.settings.top_k, stop_ids=self.stop_ids, pad_id=self.chat.end_of_text)
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

    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        return await asyncio.to_thread(self._generate, requests)


class OpenAIPolicy:
    """A policy served behind an OpenAI-compatible chat API (vLLM, SGLang, a provider)."""

    def __init__(self, *, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY",
                 temperature: float = 0.7, max_tokens: int = 1024, timeout_s: float = 120.0,
                 max_concurrency: int = 32, max_retries: int = 5):
        import openai  # only text policies need the client

        key = os.environ.get(api_key_env) or "EMPTY"  # local servers need no key
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=key, timeout=timeout_s,
                                         max_retries=max_retries)
        self.model, self.temperature, self.max_tokens = model, temperature, max_tokens
        self._sem = asyncio.Semaphore(max_concurrency)

    async def _one(self, req: TurnRequest) -> PolicyTurn:
        async with self._sem:
            resp = await self.client.chat.completions.create(
                model=self.model, messages=req.messages, temperature=self.temperature,
                max_tokens=min(self.max_tokens, req.max_new_tokens))
        choice = resp.choices[0]
        return PolicyTurn(text=choice.message.content or "", stopped=choice.finish_reason != "length")

    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def aclose(self) -> None:
        await self.client.close()


def pad_left(prompts: list[list[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token lists to [B, length] ids and a 0/1 mask."""
    ids = np.full((len(prompts), length), pad_id, np.int32)
    mask = np.zeros((len(prompts), length), np.int32)
    for b, p in enumerate(prompts):
        ids[b, length - len(p):] = p
        mask[b, length - len(p):] = 1
    return ids, mask

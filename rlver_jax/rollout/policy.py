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
import numpy as np

from rlver_jax import sampling
from rlver_jax.chat import ChatTokens
from rlver_jax.llm_client import ChatClient, ClientSettings
from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config


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


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_new_tokens: int = 512  # static per compile; requests may ask for fewer
    # At most this many KV-cache slots kept per dialogue between turns (0: re-encode the whole
    # history every turn). Reuse makes a turn's prefill cost its new tokens only; the cache grows
    # with the dialogue up to this bound, which must hold a whole dialogue plus one turn's
    # padding, e.g. 2 x max_total_tokens.
    cache_slots: int = 0


# Prompt-length buckets: powers of two and 1.5x powers of two (at most a third is padding).
LENGTH_BUCKETS = tuple(sorted({2**k for k in range(4, 18)} | {3 * 2**k for k in range(3, 17)}))


@dataclasses.dataclass
class _Session:
    """One group of dialogues whose caches persist between turns (host bookkeeping + the cache)."""

    cache: qwen2.KVCache  # [L, B, S, K, H]
    owners: list[int | None]  # the episode each row belongs to
    fed: list[list[int]]  # the tokens each row has in the cache, in order
    next_pos: list[int]  # each row's next position id


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
        self._sessions: dict[int, _Session] = {}
        self.stop_ids = (chat_tokens.im_end, chat_tokens.end_of_text)

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
                ids, mask = pad_left(prompts, max(len(p) for p in prompts), self.chat.end_of_text)
                gen = sampling.generate(
                    self.model_cfg, self._params, ids, mask, rng=key, length_buckets=LENGTH_BUCKETS,
                    **self._sampling_kwargs())
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

    def _sampling_kwargs(self) -> dict[str, Any]:
        st = self.settings
        return dict(max_new_tokens=st.max_new_tokens, temperature=st.temperature, top_p=st.top_p,
                    top_k=st.top_k, stop_ids=self.stop_ids, pad_id=self.chat.end_of_text)

    def _session(self, requests: list[TurnRequest]) -> _Session:
        rows = sampling.bucket(max(r.slot for r in requests) + 1, None)
        sess = self._sessions.get(requests[0].session)
        if sess is None or len(sess.owners) < rows:
            # Starts small and grows (see _make_room): decoding attends over every slot.
            cache = qwen2.init_cache(self.model_cfg, rows, LENGTH_BUCKETS[0])
            sess = _Session(cache, [None] * rows, [[] for _ in range(rows)], [0] * rows)
            self._sessions[requests[0].session] = sess
        return sess

    def _make_room(self, sess: _Session, needed: int) -> None:
        """Ensure `needed` free slots after the cache's index: compact out the slots of padding
        and finished rows, else grow the cache to the next length bucket (at most cache_slots)."""
        capacity = sess.cache.mask.shape[1]
        if int(sess.cache.index) + needed <= capacity:
            return
        sess.cache = sampling.compact_cache(sess.cache)
        if int(sess.cache.index) + needed <= capacity:
            return
        total = int(sess.cache.index) + needed
        if total > self.settings.cache_slots:
            raise ValueError(
                f"a dialogue of {int(sess.cache.index)} cached tokens needs {needed} more slots, beyond "
                f"config.rollout.cache_slots={self.settings.cache_slots}; raise it (about 2 x "
                "config.rollout.max_total_tokens) or lower config.rollout.max_total_tokens")
        sess.cache = sampling.grow_cache(sess.cache, min(sampling.bucket(total, LENGTH_BUCKETS),
                                                         self.settings.cache_slots))

    def _generate_with_sessions(self, requests: list[TurnRequest], key: jax.Array):
        """One turn for dialogues whose earlier turns are already in their rows' caches."""
        if len({r.session for r in requests}) != 1:
            raise ValueError("one act() call must hold the dialogues of one session")
        sess = self._session(requests)
        new: dict[int, list[int]] = {}
        for r in requests:
            row, prompt = r.slot, r.prompt_ids
            if sess.owners[row] != r.episode or prompt[:len(sess.fed[row])] != sess.fed[row]:
                # A new dialogue in this row (or a history we did not write): start it afresh.
                sess.owners[row], sess.fed[row], sess.next_pos[row] = r.episode, [], 0
                sess.cache = sess.cache._replace(mask=sess.cache.mask.at[row].set(False))
            new[row] = prompt[len(sess.fed[row]):]
        width = sampling.bucket(max(len(v) for v in new.values()), LENGTH_BUCKETS)
        self._make_room(sess, width + self.settings.max_new_tokens)
        rows = len(sess.owners)
        ids = np.full((rows, width), self.chat.end_of_text, np.int32)
        mask = np.zeros((rows, width), bool)
        for row, toks in new.items():
            ids[row, width - len(toks):] = toks
            mask[row, width - len(toks):] = True
        settings = sampling.SamplingSettings(**self._sampling_kwargs())
        gen, sess.cache, fed = sampling.continue_generation(
            self.model_cfg, self._params, sess.cache, ids, mask, np.asarray(sess.next_pos, np.int32),
            settings=settings, rng=key)
        tokens, lps, lengths, fed = jax.device_get((gen.tokens, gen.model_logprobs, gen.lengths, fed))
        out = []
        for r in requests:
            row, k = r.slot, int(lengths[r.slot])
            sess.fed[row] += new[row] + tokens[row, :fed[row]].tolist()
            sess.next_pos[row] += len(new[row]) + int(fed[row])
            out.append((tokens[row, :k].tolist(), lps[row, :k].tolist()))
        return out

    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        return await asyncio.to_thread(self._generate, requests)

    def release(self, session: int) -> None:
        with self._device_lock:
            self._sessions.pop(session, None)


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


def pad_left(prompts: list[list[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token lists to [B, length] ids and a 0/1 mask."""
    ids = np.full((len(prompts), length), pad_id, np.int32)
    mask = np.zeros((len(prompts), length), np.int32)
    for b, p in enumerate(prompts):
        ids[b, length - len(p):] = p
        mask[b, length - len(p):] = 1
    return ids, mask

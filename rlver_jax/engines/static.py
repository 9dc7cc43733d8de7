"""`StaticEngine`: the static sampler (config.rollout.engine="static"): each call, the turns of the
dialogues then waiting (rollout.ready_batches), prefilled and decoded with
rlver_jax.sampling.generation until its longest reply stops, on the trainer's parameters in the
host-local copy each process keeps for sampling (rlver_jax.parallel.sampling_copy.SamplingLayout;
token ids and log-probs out, for training). The rollout engine (engines.continuous) is the default;
this is its comparison (benchmarks/rollout.py). Apart from engines.seam so that served policies
never import JAX.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import jax
import numpy as np

from rlver_jax.engines.kv_sessions import KVSessions
from rlver_jax.engines.published import Published
from rlver_jax.engines.seam import PolicyTurn, TurnRequest
from rlver_jax.engines.table import EngineSettings
from rlver_jax.engines.turns import own_copy, policy_turn, raw_key, sampler_settings, stop_ids, turn_keys
from rlver_jax.models.config import Qwen2Config
from rlver_jax.sampling import generation
from rlver_jax.sampling.buckets import LENGTH_BUCKETS
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.text.chat import ChatTokens


class StaticEngine:
    """Samples on parameters the trainer publishes (engines.seam.Engine); one device call at a time.

    Each turn samples on the parameters `publish` gave its version (TurnRequest.version;
    rollout.versions), which may change within a dialogue: a cache row written under another
    version is encoded afresh. Waiting for a version happens in the worker thread, outside the
    device lock.

    The parameters are this process's sampling copy (on its own devices), so generation never
    waits on another host. Generation runs in a worker thread so the asyncio loop keeps serving
    simulator requests of other dialogues meanwhile. A turn's key is
    fold_in(fold_in(rng, request.dialogue), request.turn), one per row (generation.row_keys): a
    dialogue's tokens are a function of (rng, its index) alone, whatever it is batched with,
    whichever pipeline group, process or device count runs it. With settings.cache_slots > 0
    each dialogue's KV cache is kept between turns (kv_sessions).
    """

    def __init__(self, model_cfg: Qwen2Config, chat_tokens: ChatTokens, settings: SamplingSettings,
                 engine: EngineSettings, rng: jax.Array):
        del engine  # the engine's rows and chunks: static calls have none
        self.model_cfg = model_cfg
        self.chat = chat_tokens
        self.stop_ids = stop_ids(chat_tokens)
        self.settings = sampler_settings(settings, chat_tokens)
        self.published = Published()
        self._rng = raw_key(rng)
        self._device_lock = threading.Lock()
        self._sessions = KVSessions(model_cfg, settings.cache_slots, chat_tokens.end_of_text)

    def publish(self, version: int, params: Any, *, private: bool = False) -> None:
        self.published.put(version, own_copy(params) if private else params)

    def reseed(self, rng: jax.Array) -> None:
        with self._device_lock:
            self._rng = raw_key(rng)
            self._sessions.clear()

    def _generate(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        wanted = requests[0].version
        if any(r.version != wanted for r in requests):
            raise ValueError("one act() call must hold the turns of one version")
        # Outside the device lock: waiting for a version must not hold up other sessions' calls.
        version, params = self.published.resolve(wanted)
        with self._device_lock:
            # Each request's turn key, raw [len(requests), 2]; host arrays, so generation places
            # them with the parameters, on whatever devices hold those.
            key = np.asarray(turn_keys(self._rng, np.array([r.dialogue for r in requests], np.int32),
                                        np.array([r.turn for r in requests], np.int32)))
            if not self.settings.cache_slots:
                out, reencoded = self._generate_afresh(requests, key, params), False
            else:  # a call beyond any cache of cache_slots is encoded afresh
                cached = self._generate_with_sessions(requests, key, params, version)
                out, reencoded = cached if cached is not None else (self._generate_afresh(requests, key, params), True)
        return [policy_turn(self.chat, ids[:req.max_new_tokens], lps[:req.max_new_tokens], reencoded=reencoded,
                            version=version) for req, (ids, lps) in zip(requests, out)]

    def _generate_afresh(self, requests: list[TurnRequest], key: np.ndarray, params: Any
                         ) -> list[tuple[list[int], list[float]]]:
        """One turn for each request, its whole prompt encoded (no cache kept)."""
        prompts = [r.prompt_ids for r in requests]
        ids, mask = generation.pad_left(prompts, max(len(p) for p in prompts), self.chat.end_of_text)
        st = self.settings
        gen = generation.generate(
            self.model_cfg, params, ids, mask, rng=key, length_buckets=LENGTH_BUCKETS,
            max_new_tokens=st.max_new_tokens, temperature=st.temperature, top_p=st.top_p,
            top_k=st.top_k, stop_ids=st.stop_ids, pad_id=st.pad_id, vocab_limit=st.vocab_limit,
            limits=[r.max_new_tokens for r in requests])
        tokens, lps, lengths = jax.device_get((gen.tokens, gen.model_logprobs, gen.lengths))
        return [(tokens[b, :n].tolist(), lps[b, :n].tolist()) for b, n in enumerate(lengths)]

    def _generate_with_sessions(self, requests: list[TurnRequest], key: np.ndarray, params: Any, version: int | None):
        """One turn for dialogues whose earlier turns are already in their rows' caches; `key`:
        each request's turn key, placed in its cache row (other rows run nothing). A row is owned by
        (episode, `version`), so a row cached under other parameters is encoded afresh. Returns the
        turns and whether the session was rebuilt for them, or None when the call does not fit a
        cache of cache_slots at all (kv_sessions)."""
        if len({r.session for r in requests}) != 1:
            raise ValueError("one act() call must hold the dialogues of one session")
        feed = self._sessions.feed(requests[0].session,
                                   [(r.slot, (r.episode, version), r.prompt_ids) for r in requests],
                                   self.settings.max_new_tokens)
        if feed is None:
            return None
        row_keys = np.zeros((feed.ids.shape[0],) + key.shape[1:], key.dtype)
        row_keys[[r.slot for r in requests]] = key
        limits = np.zeros(feed.ids.shape[0], np.int32)  # rows of no request: nothing to write
        limits[[r.slot for r in requests]] = [r.max_new_tokens for r in requests]
        gen, cache, fed = generation.continue_generation(
            self.model_cfg, params, feed.session.cache, feed.ids, feed.mask, feed.start_positions,
            settings=self.settings, rng=row_keys, limits=limits)
        tokens, lps, lengths, fed = jax.device_get((gen.tokens, gen.model_logprobs, gen.lengths, fed))
        self._sessions.commit(feed, cache, tokens, fed)
        return [(tokens[r.slot, :lengths[r.slot]].tolist(), lps[r.slot, :lengths[r.slot]].tolist())
                for r in requests], feed.reencoded

    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        return await asyncio.to_thread(self._generate, requests)

    def release(self, session: int) -> None:
        with self._device_lock:
            self._sessions.release(session)


"""KV caches kept between the turns of multi-turn dialogues, so a turn's prefill costs only its new
tokens (JaxPolicy with SamplingSettings.cache_slots > 0).

A session is a group of dialogues generated together (a pipeline group of EpisodeRunner), one
cache row per dialogue. The host keeps, per row, the dialogue that owns it, the tokens it has in
the cache and its next position id; a row whose prompt does not extend what it holds (a new
dialogue, or a history we did not write) starts afresh. Caches start at the smallest length bucket
and grow by bucket up to cache_slots, after compacting out the slots of padding and finished rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rlver_jax.sampling import generation
from rlver_jax.sampling.buckets import LENGTH_BUCKETS, bucket
from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config


@dataclasses.dataclass
class Session:
    """One group of dialogues whose caches persist between turns (host bookkeeping + the cache)."""

    cache: qwen2.KVCache  # [L, B, S, K, H]
    owners: list[int | None]  # the episode each row belongs to
    fed: list[list[int]]  # the tokens each row has in the cache, in order
    next_pos: list[int]  # each row's next position id


@dataclasses.dataclass(frozen=True)
class Feed:
    """The input of one multi-turn generation call: per row, the tokens not yet in its cache."""

    session: Session
    new: dict[int, list[int]]  # row -> its new tokens (rows of this call only)
    ids: np.ndarray  # int32 [B, E]: `new`, left-padded to a length bucket
    mask: np.ndarray  # bool [B, E]
    start_positions: np.ndarray  # int32 [B]: each row's position id of its first new token


class KVSessions:
    """The sessions of one policy; `len()` is how many are held."""

    def __init__(self, model_cfg: Qwen2Config, cache_slots: int, pad_id: int):
        self.model_cfg, self.cache_slots, self.pad_id = model_cfg, cache_slots, pad_id
        self._sessions: dict[int, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __getitem__(self, session: int) -> Session:
        return self._sessions[session]

    def clear(self) -> None:
        """Drop every cache (they were computed with parameters that are no longer current)."""
        self._sessions.clear()

    def release(self, session: int) -> None:
        self._sessions.pop(session, None)

    def feed(self, session: int, prompts: Sequence[tuple[int, int, list[int]]], max_new_tokens: int) -> Feed:
        """The call for `prompts`, (slot, episode, prompt ids) per dialogue of `session`, with room in
        the cache for the new tokens and `max_new_tokens` generated ones."""
        sess = self._session(session, max(slot for slot, _, _ in prompts) + 1)
        new: dict[int, list[int]] = {}
        for row, episode, prompt in prompts:
            if sess.owners[row] != episode or prompt[:len(sess.fed[row])] != sess.fed[row]:
                # A new dialogue in this row (or a history we did not write): start it afresh.
                sess.owners[row], sess.fed[row], sess.next_pos[row] = episode, [], 0
                sess.cache = sess.cache._replace(mask=sess.cache.mask.at[row].set(False))
            new[row] = prompt[len(sess.fed[row]):]
        width = bucket(max(len(v) for v in new.values()), LENGTH_BUCKETS)
        self._make_room(sess, width + max_new_tokens)
        ids, mask = generation.pad_left([new.get(row, []) for row in range(len(sess.owners))], width, self.pad_id)
        return Feed(sess, new, ids, mask, np.asarray(sess.next_pos, np.int32))

    def commit(self, feed: Feed, cache: qwen2.KVCache, tokens: np.ndarray, fed: np.ndarray) -> None:
        """Record the call's result: the new cache, and per row its new tokens plus the first
        `fed[row]` generated `tokens`, which the call wrote into the cache."""
        sess = feed.session
        sess.cache = cache
        for row, toks in feed.new.items():
            sess.fed[row] += toks + tokens[row, :fed[row]].tolist()
            sess.next_pos[row] += len(toks) + int(fed[row])

    def _session(self, session: int, rows_needed: int) -> Session:
        rows = bucket(rows_needed)
        sess = self._sessions.get(session)
        if sess is None or len(sess.owners) < rows:
            # Starts small and grows (see _make_room): decoding attends over every slot.
            cache = qwen2.init_cache(self.model_cfg, rows, LENGTH_BUCKETS[0])
            sess = Session(cache, [None] * rows, [[] for _ in range(rows)], [0] * rows)
            self._sessions[session] = sess
        return sess

    def _make_room(self, sess: Session, needed: int) -> None:
        """Ensure `needed` free slots after the cache's index: compact out the slots of padding
        and finished rows, else grow the cache to the next length bucket (at most cache_slots)."""
        capacity = sess.cache.mask.shape[1]
        if int(sess.cache.index) + needed <= capacity:
            return
        sess.cache = generation.compact_cache(sess.cache)
        if int(sess.cache.index) + needed <= capacity:
            return
        total = int(sess.cache.index) + needed
        if total > self.cache_slots:
            raise ValueError(
                f"a dialogue of {int(sess.cache.index)} cached tokens needs {needed} more slots, beyond "
                f"config.rollout.cache_slots={self.cache_slots}; raise it (a row's fill plus another row's fresh "
                "prompt: 2 x config.rollout.max_total_tokens + max_new_tokens) or lower "
                "config.rollout.max_total_tokens")
        sess.cache = generation.grow_cache(sess.cache, min(bucket(total, LENGTH_BUCKETS), self.cache_slots))

"""KV caches kept between the turns of multi-turn dialogues, so a turn's prefill costs only its new
tokens (StaticEngine with SamplingSettings.cache_slots > 0).

A session is a group of dialogues generated together (a pipeline group of EpisodeRunner), one
cache row per dialogue; a call feeds the rows of the dialogues ready for a turn
(rollout.ready_batches), the others run nothing. The host keeps, per row, the dialogue that owns
it (the policy's key: its episode and parameter version), the tokens it has in the cache and its
next position id; a row of another owner (a new dialogue, or one now sampled with other
parameters) or whose prompt does not extend what it holds (a history we did not write) starts
afresh. Caches start at the
smallest length bucket and grow by bucket up to cache_slots, after compacting out the slots of
padding and finished rows. The rows share one fill level, so a call takes its width plus
max_new_tokens slots of every row: per-dialogue progress, with more and smaller calls, compacts
more often.

A turn that would still not fit (cache_slots below sampling.cache_bound.session_slots) does not end
the run: the rows of no dialogue of the call give their slots back, and if that is not enough the
session is rebuilt with every dialogue of the call encoded afresh (`Feed.reencoded`, a warning);
when not even that fits, `feed` returns None and the policy encodes the call without a cache.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Hashable, Sequence

import numpy as np

from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config
from rlver_jax.sampling import generation
from rlver_jax.sampling.buckets import LENGTH_BUCKETS, bucket

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Session:
    """One group of dialogues whose caches persist between turns (host bookkeeping + the cache)."""

    cache: qwen2.KVCache  # [L, B, S, K, H]
    owners: list[Hashable | None]  # who each row belongs to (StaticEngine: the episode and parameter version)
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
    reencoded: bool = False  # the session was rebuilt for this call: its rows' histories encoded afresh


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

    def feed(self, session: int, prompts: Sequence[tuple[int, Hashable, list[int]]], max_new_tokens: int
             ) -> Feed | None:
        """The call for `prompts`, (slot, owner, prompt ids) per dialogue of `session`, with room in
        the cache for the new tokens and `max_new_tokens` generated ones; None when not even a fresh
        cache of cache_slots holds the call (the session is dropped: encode the call without it)."""
        sess = self._session(session, max(slot for slot, _, _ in prompts) + 1)
        for row, owner, prompt in prompts:
            if sess.owners[row] != owner or prompt[:len(sess.fed[row])] != sess.fed[row]:
                # A new owner of this row (or a history we did not write): start it afresh.
                self._reset(sess, [row])
                sess.owners[row] = owner
        new = {row: prompt[len(sess.fed[row]):] for row, _, prompt in prompts}
        width = bucket(max(len(v) for v in new.values()), LENGTH_BUCKETS)
        reencoded = False
        if not self._make_room(sess, width + max_new_tokens):
            if (fitted := self._beyond_cache_slots(session, sess, prompts, new, width, max_new_tokens)) is None:
                return None
            new, width, reencoded = fitted
        ids, mask = generation.pad_left([new.get(row, []) for row in range(len(sess.owners))], width, self.pad_id)
        return Feed(sess, new, ids, mask, np.asarray(sess.next_pos, np.int32), reencoded)

    def _beyond_cache_slots(self, session: int, sess: Session, prompts: Sequence[tuple[int, Hashable, list[int]]],
                            new: dict[int, list[int]], width: int, max_new_tokens: int
                            ) -> tuple[dict[int, list[int]], int, bool] | None:
        """Room for a call that does not fit cache_slots (the module docstring): the new tokens,
        their width and whether the session was rebuilt, or None (dropped: no cache holds the call)."""
        cached = int(sess.cache.index)
        # Rows of no dialogue of this call (dialogues that are over, or not ready: encoded afresh
        # at their next turn) give their slots back.
        others = [row for row in range(len(sess.owners)) if row not in new]
        self._reset(sess, others)
        if self._make_room(sess, width + max_new_tokens):
            log.debug("KV cache of session %d: rows %s of no dialogue of this call gave their slots back (%d cached "
                     "tokens plus %d slots for this turn were beyond cache_slots=%d)", session, others, cached,
                     width + max_new_tokens, self.cache_slots)
            return new, width, False
        self._reset(sess, list(new))  # rebuilt: every dialogue of the call encoded afresh
        for row, owner, _ in prompts:
            sess.owners[row] = owner
        afresh = {row: list(prompt) for row, _, prompt in prompts}
        wide = bucket(max(len(v) for v in afresh.values()), LENGTH_BUCKETS)
        fits = self._make_room(sess, wide + max_new_tokens)
        log.warning(
            "KV cache of session %d: %d cached tokens plus this turn's %d slots are beyond cache_slots=%d; %s "
            "(counted in kv_cache_reencodes). Configs size cache_slots with rlver_jax.sampling.cache_bound",
            session, cached, width + max_new_tokens, self.cache_slots,
            f"its {len(afresh)} dialogue(s) are encoded afresh" if fits else
            f"not even the {wide} slots of the prompts afresh fit: this turn is encoded without the cache")
        if not fits:
            self.release(session)
            return None
        return afresh, wide, True

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

    @staticmethod
    def _reset(sess: Session, rows: list[int]) -> None:
        """Empty `rows`: no owner, nothing cached (their old slots masked out, freed by compacting)."""
        if not rows:
            return
        for row in rows:
            sess.owners[row], sess.fed[row], sess.next_pos[row] = None, [], 0
        sess.cache = sess.cache._replace(mask=sess.cache.mask.at[np.asarray(rows)].set(False))

    def _make_room(self, sess: Session, needed: int) -> bool:
        """Ensure `needed` free slots after the cache's index: compact out the slots of padding
        and finished rows, else grow the cache to the next length bucket, at most cache_slots;
        False (the cache compacted, not grown) when more than cache_slots would be needed."""
        capacity = sess.cache.mask.shape[1]
        if int(sess.cache.index) + needed <= capacity:
            return True
        sess.cache = generation.compact_cache(sess.cache)
        if int(sess.cache.index) + needed <= capacity:
            return True
        total = int(sess.cache.index) + needed
        if total > self.cache_slots:
            return False
        sess.cache = generation.grow_cache(sess.cache, min(bucket(total, LENGTH_BUCKETS), self.cache_slots))
        return True

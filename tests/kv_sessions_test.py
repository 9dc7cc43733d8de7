"""Host bookkeeping of the KV caches kept between turns: new tokens per row, resets, growth."""

import logging

import jax.numpy as jnp
import numpy as np

from rlver_jax.engines.kv_sessions import KVSessions
from rlver_jax.models.config import get_preset
from rlver_jax.sampling.cache_bound import session_slots

PAD = 0


def test_each_row_gets_only_what_its_cache_lacks():
    sessions = KVSessions(get_preset("tiny"), cache_slots=64, pad_id=PAD)
    # Session 7: dialogues 100 and 101 in rows 0 and 2 (4 rows: the power-of-two bucket of 3).
    feed = sessions.feed(7, [(0, 100, [1, 2, 3]), (2, 101, [4, 5])], max_new_tokens=4)
    assert len(sessions) == 1 and feed.new == {0: [1, 2, 3], 2: [4, 5]}
    # Left-padded to the smallest prompt bucket, 16; rows 1 and 3 have nothing new.
    np.testing.assert_array_equal(feed.ids, [[PAD] * 13 + [1, 2, 3], [PAD] * 16, [PAD] * 14 + [4, 5], [PAD] * 16])
    np.testing.assert_array_equal(feed.mask, [[0] * 13 + [1] * 3, [0] * 16, [0] * 14 + [1] * 2, [0] * 16])
    np.testing.assert_array_equal(feed.start_positions, [0, 0, 0, 0])
    # 16 new + 4 generated slots do not fit the first 16-slot cache: grown to the next bucket, 24.
    assert feed.session.cache.mask.shape == (4, 24)

    # The call generated [9, 8, 7, 6] in row 0 and fed back the first two; row 2: [3, 2, ...], one.
    tokens = np.array([[9, 8, 7, 6], [0] * 4, [3, 2, 0, 0], [0] * 4])
    cache = feed.session.cache
    sessions.commit(feed, cache._replace(mask=cache.mask.at[2, :3].set(True)), tokens, np.array([2, 0, 1, 0]))
    assert sessions[7].fed[0] == [1, 2, 3, 9, 8] and sessions[7].next_pos[:3] == [5, 0, 3]

    # Row 0 continues its dialogue: only its last sampled token and the user's reply are new. Row 2
    # now holds another dialogue (episode 102): it starts afresh, its old slots masked out.
    feed = sessions.feed(7, [(0, 100, [1, 2, 3, 9, 8, 7, 11]), (2, 102, [4, 5, 3])], max_new_tokens=4)
    assert feed.new == {0: [7, 11], 2: [4, 5, 3]}
    np.testing.assert_array_equal(feed.start_positions, [5, 0, 0, 0])
    assert not feed.session.cache.mask[2].any()
    # A history that does not extend what a row holds (here: an edited prompt) also starts afresh.
    feed = sessions.feed(7, [(0, 100, [1, 2, 99])], max_new_tokens=4)
    assert feed.new == {0: [1, 2, 99]} and feed.start_positions[0] == 0

    sessions.release(7)
    assert len(sessions) == 0


def _generated(feed, fed, steps):
    """What continue_generation leaves in the cache: per row its new tokens, then `fed[row]` of
    the `steps` decode slots, the index past all of them (a stand-in for the model)."""
    cache = feed.session.cache
    index, width = int(cache.index), feed.ids.shape[1]
    mask = np.asarray(cache.mask).copy()
    mask[:, index:index + width] |= feed.mask
    for row, n in enumerate(fed):
        mask[row, index + width:index + width + n] = True
    return cache._replace(mask=jnp.asarray(mask), index=jnp.asarray(index + width + steps, jnp.int32))


def _turn(sessions, session, prompts, fed, max_new_tokens):
    """One call: feed `prompts`, let each row feed back `fed[row]` of max_new_tokens sampled tokens."""
    feed = sessions.feed(session, prompts, max_new_tokens)
    tokens = np.full((feed.ids.shape[0], max_new_tokens), 7)
    counts = np.zeros(feed.ids.shape[0], int)
    counts[[row for row, _, _ in prompts]] = fed
    sessions.commit(feed, _generated(feed, counts, max_new_tokens), tokens, counts)
    return feed


def test_session_slots_by_hand():
    # max_total_tokens 40: prompts of at most 38 tokens (bucket 48); 38 + 48 + 8 = 94 -> 96.
    assert session_slots(40, 8) == 96
    # The tiny presets: 1022 + 1024 + 48 = 2094 -> 2096 (training), 1022 + 1024 + 32 = 2078 -> 2080 (evaluation).
    assert (session_slots(1024, 48), session_slots(1024, 32)) == (2096, 2080)
    # 7B no-think: 14998 + 16384 + 5000 = 36382 -> 36384 (2 x 15000 + 5000 = 35000 is too small).
    assert session_slots(15000, 5000) == 36384


def test_the_worst_turn_fits_session_slots():
    """A row whose dialogue ended holds its longest prompt plus max_new_tokens - 1 sampled tokens (the
    tiny evaluation's 1052 of 1024); another row continues to the longest prompt while a third starts
    one afresh: this needs more than 2 x max_total_tokens + max_new_tokens, and fits session_slots."""
    total, new_tokens = 40, 8
    longest = total - 2
    slots = session_slots(total, new_tokens)
    sessions = KVSessions(get_preset("tiny"), cache_slots=slots, pad_id=PAD)
    _turn(sessions, 0, [(0, 10, [1] * longest), (1, 11, [2] * (longest - new_tokens)), (2, 12, [3])],
          fed=[new_tokens - 1] * 3, max_new_tokens=new_tokens)
    sess = sessions[0]
    assert [len(f) for f in sess.fed] == [longest + new_tokens - 1, longest - 1, new_tokens, 0]
    # Dialogue 10 is over. Row 1 continues (one new token), row 2 holds a fresh prompt (think_history "drop").
    prompts = [(1, 11, sess.fed[1] + [4]), (2, 12, [5] * longest)]
    without_the_finished_row = (longest - 1) + 48 + new_tokens
    assert (longest + new_tokens - 1) + 48 + new_tokens > slots >= without_the_finished_row > 2 * total + new_tokens
    feed = sessions.feed(0, prompts, new_tokens)
    assert not feed.reencoded and feed.new == {1: [4], 2: [5] * longest}
    assert feed.session.owners[0] is None and not np.asarray(feed.session.cache.mask[0]).any()
    assert int(feed.session.cache.index) + 48 + new_tokens <= feed.session.cache.mask.shape[1] <= slots


def test_a_turn_beyond_cache_slots_is_encoded_afresh(caplog):
    sessions = KVSessions(get_preset("tiny"), cache_slots=36, pad_id=PAD)
    _turn(sessions, 0, [(0, 1, [1] * 16), (1, 2, [2])], fed=[3, 3], max_new_tokens=4)
    assert [len(f) for f in sessions[0].fed] == [19, 4]
    # Row 1 starts a 16-token prompt afresh: 19 cached + 16 + 4 > 36, and both rows are in the
    # call: the session is rebuilt, each row's whole prompt fed from position 0.
    with caplog.at_level(logging.WARNING):
        feed = sessions.feed(0, [(0, 1, [1] * 16 + [7] * 3 + [8]), (1, 2, [9] * 16)], max_new_tokens=4)
    assert feed.reencoded and feed.new == {0: [1] * 16 + [7] * 3 + [8], 1: [9] * 16}
    assert feed.ids.shape == (2, 24) and list(feed.start_positions) == [0, 0]
    assert not np.asarray(feed.session.cache.mask).any() and feed.session.cache.mask.shape[1] <= 36
    assert "19 cached tokens" in caplog.text and "cache_slots=36" in caplog.text
    # Not even a fresh cache holds a 16-token prompt and 4 new tokens in 16 slots: no feed, no session.
    small = KVSessions(get_preset("tiny"), cache_slots=16, pad_id=PAD)
    assert small.feed(0, [(0, 1, [1, 2, 3])], max_new_tokens=4) is None and len(small) == 0

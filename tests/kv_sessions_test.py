"""Host bookkeeping of the KV caches kept between turns: new tokens per row, resets, growth."""

import numpy as np
import pytest

from rlver_jax.models.config import get_preset
from rlver_jax.rollout.kv_sessions import KVSessions

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


def test_a_dialogue_beyond_cache_slots_names_the_field():
    sessions = KVSessions(get_preset("tiny"), cache_slots=16, pad_id=PAD)
    with pytest.raises(ValueError, match="config.rollout.cache_slots=16"):
        sessions.feed(0, [(0, 1, [1, 2, 3])], max_new_tokens=4)

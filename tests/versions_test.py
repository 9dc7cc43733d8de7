"""rollout.versions: the version each turn of a batch asks for, by hand; and how the buffer
resolves a version that was never published (rollout.buffer.RolloutBuffer.resolve)."""

import threading

import pytest

from rlver_jax.engines.published import RolloutClosed
from rlver_jax.rollout.versions import VersionSchedule
from tests.buffer_test import _buffer


@pytest.mark.parametrize("staleness, partial, expected", [
    (0, True, [5, 5, 5, 5]),  # on-policy: batch 5 by version 5
    (0, False, [5, 5, 5, 5]),
    (1, True, [4, 4, 4, 4]),  # one behind: the cap (version 4 = step 3's update) is the first version
    (1, False, [4, 4, 4, 4]),
    (2, True, [3, 4, 4, 4]),  # starts two behind, moves to version 4 for its second turn
    (2, False, [3, 3, 3, 3]),
    (3, True, [2, 3, 4, 4, 4]),
    (3, False, [2, 2, 2, 2, 2]),
])
def test_turn_versions_of_batch_5(staleness, partial, expected):
    schedule = VersionSchedule.for_batch(5, staleness, partial)
    assert [schedule.version(turn) for turn in range(len(expected))] == expected


def test_first_batches_ask_for_versions_before_the_run():
    assert [VersionSchedule.for_batch(0, 2, True).version(t) for t in range(3)] == [-2, -1, -1]
    assert [VersionSchedule.for_batch(1, 3, True).version(t) for t in range(4)] == [-2, -1, 0, 0]
    assert [VersionSchedule.fixed(7).version(t) for t in range(3)] == [7, 7, 7]  # an evaluation


def test_bad_schedules_are_refused():
    with pytest.raises(ValueError, match=r"config.rollout.max_staleness=-1 must be >= 0"):
        VersionSchedule.for_batch(3, -1, True)
    with pytest.raises(ValueError, match="precedes its first"):
        VersionSchedule(4, 3)


def _idle_buffer():
    """A buffer whose producer waits for a version never published (batch 100, on-policy), so only
    `resolve` is exercised."""
    async def make_batch(index, versions, resolve):
        raise AssertionError("no batch starts")
    return _buffer(make_batch, max_staleness=0, start_index=100)


def test_resolve_at_the_start_of_a_run_and_on_resume():
    buf = _idle_buffer()
    try:
        buf.publish(0, "p0")  # the start of a run: versions below 0 are version 0
        assert [buf.resolve(w) for w in (-2, -1, 0)] == [(0, "p0")] * 3
        buf.publish(1, "p1")
        assert buf.resolve(1) == (1, "p1") and buf.resolve(0) == (0, "p0")
    finally:
        buf.close()
    buf = _idle_buffer()
    try:
        buf.publish(5, "p5")  # a resume at step 5 whose checkpoint lacks versions 3 and 4: the newest
        assert [buf.resolve(w) for w in (3, 4, 5)] == [(5, "p5")] * 3
    finally:
        buf.close()
    buf = _idle_buffer()
    try:
        for v in (3, 4, 5):  # a resume whose checkpoint holds them: exact
            buf.publish(v, f"p{v}")
        assert [buf.resolve(w) for w in (3, 4, 5)] == [(3, "p3"), (4, "p4"), (5, "p5")]
    finally:
        buf.close()


def test_resolve_waits_for_the_version_and_close_wakes_it():
    buf = _idle_buffer()
    buf.publish(0, "p0")
    got = []

    def wait_for(version):
        try:
            got.append(buf.resolve(version))
        except RolloutClosed as e:
            got.append(e)

    first = threading.Thread(target=wait_for, args=(1,))
    first.start()
    first.join(0.3)
    assert first.is_alive() and not got  # version 1 is not published yet
    buf.publish(1, "p1")
    first.join(5)
    assert got == [(1, "p1")]
    second = threading.Thread(target=wait_for, args=(2,))
    second.start()
    second.join(0.3)
    buf.close()
    second.join(5)
    assert not second.is_alive() and isinstance(got[-1], RolloutClosed)

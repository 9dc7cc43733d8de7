"""The async rollout buffer: order, the staleness bound, failures, the copy-on-publish rule, and the
versions of partial rollouts."""

import asyncio
import threading
import time

import pytest

from rlver_jax.engines.published import Published, RolloutClosed
from rlver_jax.rollout.buffer import RolloutBuffer


class Store:
    """An engine that only keeps what is published (its turns are the tests' own), and whether it
    was asked to keep a copy of its own (`private`)."""

    def __init__(self):
        self.published = Published()
        self.private = []

    def publish(self, version, params, *, private=False):
        self.private.append(private)
        self.published.put(version, params)


def _buffer(make_batch, **kwargs):
    """A buffer over a Store; make_batch(index, versions, resolve) resolves with the store's."""
    store = Store()
    return RolloutBuffer(lambda i, v: make_batch(i, v, store.published.resolve), store, **kwargs)


def _fake_batches(delay=0.0, fail_at=None):
    async def make_batch(index, versions, resolve):
        _, params = resolve(versions.first)  # published: the batch starts once it is
        if index == fail_at:
            raise ValueError("simulator exploded")
        await asyncio.sleep(delay)
        return [params]
    return make_batch


@pytest.mark.parametrize("staleness", [0, 1])
def test_buffer_respects_max_staleness(staleness):
    buf = _buffer(_fake_batches(0.01), max_staleness=staleness)
    buf.publish(0, "v0")
    seen = []
    for step in range(5):
        batch = buf.get(timeout=10)
        assert batch.index == step and step - staleness <= batch.version <= step
        assert batch.sequences == [f"v{batch.version}"]  # the snapshot matches the version
        seen.append(batch.version)
        time.sleep(0.05)  # "training"
        buf.publish(step + 1, f"v{step + 1}")
    buf.close()
    if staleness == 1:
        assert any(v == s - 1 for s, v in enumerate(seen))  # it did overlap


def test_buffer_surfaces_producer_failure():
    buf = _buffer(_fake_batches(fail_at=1), max_staleness=1)
    buf.publish(0, "v0")
    buf.get(timeout=10)
    with pytest.raises(RuntimeError, match="simulator exploded"):
        buf.get(timeout=10)
    buf.close()


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_publish_asks_for_a_copy_only_when_sampling_overlaps_the_update(staleness):
    """The update donates the published arrays: with max_staleness > 0 the producer samples while
    it runs, so the engine is asked to keep a copy of its own (engines_test: the JAX engines do)."""
    store = Store()
    buf = RolloutBuffer(lambda i, v: asyncio.sleep(0, []), store, max_staleness=staleness)
    buf.publish(0, "v0")
    buf.publish(1, "v1")
    assert store.private == [staleness > 0] * 2
    buf.close()


def test_partial_rollouts_follow_the_schedule_whatever_the_timing():
    """max_staleness=2 with partial rollouts: turn k of batch i is written by version
    min(i - 2 + k, i - 1) (version 0 for those before the run), by hand below, though the trainer
    publishes late (a turn waits for its version in a worker thread, as StaticEngine's does)."""
    got = {}

    async def make_batch(index, versions, resolve):
        for turn in range(3):
            got[index, turn] = (await asyncio.to_thread(resolve, versions.version(turn)))[0]
        return []

    buf = _buffer(make_batch, max_staleness=2)
    buf.publish(0, "v0")
    firsts = []
    for step in range(5):
        firsts.append(buf.get(timeout=10).version)
        time.sleep(0.1)  # a slow update: the batches in flight wait for the next version
        buf.publish(step + 1, f"v{step + 1}")
    buf.close()
    assert [[got[i, k] for k in range(3)] for i in range(5)] == [
        [0, 0, 0],  # wants -2, -1, -1
        [0, 0, 0],  # -1, 0, 0
        [0, 1, 1],
        [1, 2, 2],
        [2, 3, 3],
    ]
    assert firsts == [0, 0, 0, 1, 2]


def test_close_wakes_a_turn_waiting_for_its_version():
    waiting, woken = threading.Event(), threading.Event()

    def wait_for_version_5(resolve):
        waiting.set()
        try:
            resolve(5)  # never published
        except RolloutClosed:
            woken.set()
            raise

    async def make_batch(index, versions, resolve):
        await asyncio.to_thread(wait_for_version_5, resolve)
        return []

    buf = _buffer(make_batch, max_staleness=2)
    buf.publish(0, "v0")
    assert waiting.wait(10)
    t0 = time.perf_counter()
    buf.close()
    assert time.perf_counter() - t0 < 10 and woken.wait(10)


def test_close_unwinds_the_tasks_a_batch_left_running():
    """A sampler may serve its turns from a task of its own (the rollout engine's serving task),
    which outlives the batch that is cancelled on close: the buffer cancels it and lets it unwind
    before closing its loop, so nothing is left pending (asyncio would report it on stderr)."""
    started, unwound = threading.Event(), threading.Event()

    async def serve():
        try:
            started.set()
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            unwound.set()
            raise

    async def make_batch(index, versions, resolve):
        asyncio.get_running_loop().create_task(serve())
        await asyncio.sleep(3600)

    buf = _buffer(make_batch, max_staleness=0)
    buf.publish(0, "v0")
    assert started.wait(10)
    buf.close()
    assert unwound.is_set() and not buf._thread.is_alive()

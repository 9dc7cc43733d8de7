"""rollout.ready_batches: which dialogues share a policy call."""

import asyncio
import dataclasses
import math

import pytest

from rlver_jax.engines.seam import PolicyTurn, TurnRequest
from rlver_jax.rollout.ready_batches import ReadyBatches


class RecordingPolicy:
    """Answers each request with its slot; records every call's slots."""

    def __init__(self, fail: bool = False):
        self.calls: list[list[int]] = []
        self.called = asyncio.Event()
        self.fail = fail

    async def act(self, requests):
        self.calls.append([r.slot for r in requests])
        self.called.set()
        if self.fail:
            raise RuntimeError("device lost")
        return [PolicyTurn(text=str(r.slot)) for r in requests]

    def release(self, session):
        pass


def _request(slot):
    return TurnRequest(prompt_ids=None, messages=[], max_new_tokens=1, slot=slot)


def _play(policy, wait_s, dialogues):
    """Runs `dialogues` (coroutine functions of the ReadyBatches) beside its serve(); their results."""

    async def main():
        calls = ReadyBatches(policy, wait_s, len(dialogues))

        async def one(dialogue):
            try:
                return await dialogue(calls)
            finally:
                calls.leave()

        return await asyncio.gather(calls.serve(), *(one(d) for d in dialogues))

    return asyncio.run(main())[1:]


def test_an_infinite_wait_is_a_lockstep_round_of_every_live_dialogue():
    def ready_after(slot, delay_s):
        async def dialogue(calls):
            await asyncio.sleep(delay_s)
            return (await calls.act(_request(slot))).text
        return dialogue

    async def leaves(calls):
        await asyncio.sleep(0.05)  # over before its first turn: the round does not wait for it

    policy = RecordingPolicy()
    answers = _play(policy, math.inf, [ready_after(2, 0.02), ready_after(0, 0.0), leaves, ready_after(1, 0.04)])
    assert policy.calls == [[0, 1, 2]] and answers == ["2", "0", None, "1"]


def test_a_zero_wait_calls_for_whoever_is_ready():
    policy = RecordingPolicy()

    def ready_now(slot):
        async def dialogue(calls):
            first = (await calls.act(_request(slot))).text
            return first, (await calls.act(_request(slot))).text
        return dialogue

    async def late(calls):  # ready only once the first call is under way
        await policy.called.wait()
        return (await calls.act(_request(2))).text

    answers = _play(policy, 0.0, [ready_now(0), ready_now(1), late])
    # The late dialogue joins the second call of the others, which were ready again meanwhile.
    assert policy.calls == [[0, 1], [0, 1, 2]] and answers == [("0", "0"), ("1", "1"), "2"]


def test_a_failed_call_fails_its_dialogues():
    async def dialogue(calls):
        return await calls.act(_request(0))

    with pytest.raises(RuntimeError, match="device lost"):
        _play(RecordingPolicy(fail=True), 0.0, [dialogue])


def test_a_call_holds_one_version():
    """Dialogues waiting for different parameter versions go out in separate calls: the earliest
    waiter's version first, the others in the next call."""
    versions = []

    class VersionPolicy(RecordingPolicy):
        async def act(self, requests):
            versions.append([r.version for r in requests])
            return await super().act(requests)

    def asks(slot, version, delay_s):
        async def dialogue(calls):
            await asyncio.sleep(delay_s)
            return (await calls.act(dataclasses.replace(_request(slot), version=version))).text
        return dialogue

    policy = VersionPolicy()
    answers = _play(policy, math.inf, [asks(0, 4, 0.02), asks(1, 3, 0.0), asks(2, 4, 0.01)])
    assert policy.calls == [[1], [0, 2]] and versions == [[3], [4, 4]]
    assert answers == ["0", "1", "2"]

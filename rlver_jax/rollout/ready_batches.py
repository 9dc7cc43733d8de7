"""Policy calls formed from the dialogues that are ready: per-dialogue progress (issue 41).

Each dialogue of a session (a pipeline group of rollout.episodes.EpisodeRunner) asks for its next
turn the moment its simulator step returns. A call goes out, for every dialogue then waiting, once
the session's previous call is over and either every live dialogue of the session is waiting or
the first of them has waited `wait_s`. So a dialogue whose user answered quickly does not wait for
the slowest user of its session (a heavy-tailed simulator latency costs each dialogue its own
calls, not every round's slowest), while a short wait lets dialogues that become ready close
together share one call. wait_s = inf waits for every live dialogue: lockstep rounds. A call holds
the turns of one parameter version (TurnRequest.version; rollout.versions): the earliest waiter's;
dialogues waiting for another version keep waiting for the next call.

Which dialogues share a call changes no dialogue's tokens: a StaticEngine draws each row from its
own (dialogue, turn) key (engines.static), so a batch's content stays a function of the
policy's key alone, whatever the latencies.
"""

from __future__ import annotations

import asyncio
import contextlib
import math

from rlver_jax.engines.seam import Policy, PolicyTurn, TurnRequest


class ReadyBatches:
    """The policy calls of one session's `live` dialogues; run `serve()` beside the dialogues,
    which call `act` for each turn and `leave` once when they end."""

    def __init__(self, policy: Policy, wait_s: float, live: int):
        self._policy, self._wait_s, self._live = policy, wait_s, live
        self._waiting: list[tuple[float, TurnRequest, asyncio.Future[PolicyTurn]]] = []
        self._changed = asyncio.Event()

    async def act(self, request: TurnRequest) -> PolicyTurn:
        """The dialogue's next turn, from the next call that takes it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[PolicyTurn] = loop.create_future()
        self._waiting.append((loop.time(), request, future))
        self._changed.set()
        return await future

    def leave(self) -> None:
        """A dialogue is over: calls no longer wait for it."""
        self._live -= 1
        self._changed.set()

    async def serve(self) -> None:
        """Make calls until every dialogue has left."""
        loop = asyncio.get_running_loop()
        while self._live > 0:
            self._changed.clear()
            if not self._waiting:
                await self._changed.wait()
                continue
            remaining = self._waiting[0][0] + self._wait_s - loop.time()
            if len(self._waiting) < self._live and remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), None if math.isinf(remaining) else remaining)
                continue
            version = self._waiting[0][1].version
            batch = sorted((w for w in self._waiting if w[1].version == version), key=lambda w: w[1].slot)
            self._waiting = [w for w in self._waiting if w[1].version != version]
            try:
                turns = await self._policy.act([request for _, request, _ in batch])
            except Exception as e:  # every dialogue of the call fails with it
                for _, _, future in batch:
                    future.set_exception(e)
                raise
            for (_, _, future), turn in zip(batch, turns):
                future.set_result(turn)

"""A host's rollout in time: its dialogues (planner.lengths: each turn's context and reply) played
against the simulated user on the engine's compiled programs, event by event, to the end of its
slowest dialogue (the host waits for it). An estimate, not a measurement. No JAX.

The continuous engine (`continuous`): KV rows (each dialogue keeps its own while rows suffice;
fewer rows are handed out least recently used, and a dialogue whose row was taken prefills its
whole context again); one program (sampling.kv_rows.chunk): a call runs up to `decode_chunk`
decode steps over the rows with a reply in progress, its first step also feeding a prefill piece
(up to `prefill_chunk` tokens) of each row entering a turn beside them. A row whose prompt ends
in its piece draws its first token in that step and decodes in the same call; a call ends when
no row is left decoding, and a reply leaves at the end of the call it stopped in; then its
dialogue waits for the simulator before its next turn. Its row keeps the common prefix: with
think_history "drop" the first prompt (the later context is rewritten without the thoughts),
else all but the turn's new tokens. A call's cost comes from the compiled program at the fill of
the rows it serves: its decode steps', and its piece's beyond them.

The static engine (`static`): pipeline groups of dialogues in lockstep, one call per group and
turn decoding until the group's longest reply stops, the groups' calls one at a time.

The simulator (`Simulator`): each turn's answer is requests x the latency per request (the emotion
step, then the user's reply but after the last turn), at most `concurrency` requests in flight per
host, each dialogue's requests one after another.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable

import numpy as np

from rlver_jax.train.planner.lengths import CLOSING, Dialogues
from rlver_jax.train.planner.terms import Terms


@dataclasses.dataclass(frozen=True)
class Simulator:
    """The simulated user's answering time, per request."""

    latency_s: float  # one request's seconds (an answer's tokens at the server's rate)
    concurrency: int  # requests in flight per host (config.simulator.max_concurrency)
    source: str  # where the figure comes from, printed

    def finish(self, start: float, requests: int, servers: list[float]) -> float:
        """When a dialogue's `requests` requests, one after another from `start`, are answered, with
        `servers` the times the host's request slots free up (a heap, updated)."""
        now = start
        for _ in range(requests):
            now = max(now, heapq.heappop(servers)) + self.latency_s
            heapq.heappush(servers, now)
        return now


def requests(turn: int, turns: int) -> int:
    """The simulator's requests after a policy turn: the emotion step, and the user's reply unless
    the dialogue ends with this turn."""
    return 1 if turn == turns - 1 else 2


@dataclasses.dataclass(frozen=True)
class RolloutTime:
    """One host's rollout: its wall time to the end of its slowest dialogue, and what filled it."""

    wall: float
    decode: Terms  # the decode calls (the continuous engine's: their decode steps), term by term
    prefill: Terms  # the prefill calls (the continuous engine's: their pieces beyond the decode steps)
    calls: int  # device calls
    sampled: int  # tokens sampled (the replies, and a call's steps past a reply's stop)
    fed: int  # tokens prefilled

    @property
    def device(self) -> float:
        return (self.decode + self.prefill).seconds

    @property
    def waiting(self) -> float:
        """Wall seconds the device is idle: every dialogue in flight waits for the simulator."""
        return max(0.0, self.wall - self.device)


@dataclasses.dataclass
class _Rows:
    """The continuous engine's KV rows, as the rollout uses them."""

    dialogues: Dialogues
    owner: list[int]  # each row's dialogue (-1: none yet)
    used: list[float]  # when each row last served a turn
    row_of: dict[int, int] = dataclasses.field(default_factory=dict)
    fill: dict[int, int] = dataclasses.field(default_factory=dict)  # tokens each dialogue's row holds
    busy: dict[int, list[int]] = dataclasses.field(default_factory=dict)  # dialogue -> [to prefill, to decode]

    def enter(self, i: int, k: int) -> bool:
        """Turn k of dialogue i takes a row (its own if it still holds its tokens, else the least
        recently used free one); False when every row serves a turn."""
        free = [r for r in range(len(self.owner)) if self.owner[r] not in self.busy]
        if not free:
            return False
        own = self.row_of.get(i)
        mine = own is not None and self.owner[own] == i and own in free
        r = own if mine else min(free, key=lambda x: self.used[x])
        d = self.dialogues
        kept = (int(d.contexts[i, 0]) if d.drop else self.fill[i]) if mine else 0
        self.owner[r], self.row_of[i], self.fill[i] = i, r, kept
        self.busy[i] = [int(d.contexts[i, k]) - kept, int(d.outputs[i, k])]
        return True


def continuous(d: Dialogues, rows: int, decode_chunk: int, prefill_chunk: int,
               decode_call: Callable[[float, int, int], Terms], piece_call: Callable[[float, int], Terms],
               sim: Simulator) -> RolloutTime:
    """The continuous engine's rollout (module docstring). `decode_call(slots, rows, steps)`: a
    call's time for `steps` decode steps over `rows` rows holding `slots` tokens in all (0 steps:
    the call's fixed cost); `piece_call(slots, rows)`: what a prefill piece for `rows` rows
    holding `slots` tokens adds to it."""
    turns, turn = d.turns, np.zeros(len(d.turns), np.int64)
    waiting = [(0.0, i) for i in range(len(turns)) if turns[i] > 0]
    servers, ready, state = [0.0] * max(1, sim.concurrency), [], _Rows(d, [-1] * rows, [0.0] * rows)
    t, decode, prefill = 0.0, Terms(), Terms()
    calls = sampled = fed = 0
    while waiting or ready or state.busy:
        while waiting and waiting[0][0] <= t:
            ready.append(heapq.heappop(waiting)[1])
        while ready and state.enter(ready[0], int(turn[ready[0]])):
            ready.pop(0)
        filling = [i for i, (p, _) in state.busy.items() if p > 0]
        piece = Terms()
        if filling:  # the call's prefill piece, in its first step
            piece = piece_call(float(sum(state.fill[i] for i in filling)), len(filling))
            for i in filling:
                n = min(prefill_chunk, state.busy[i][0])
                state.busy[i][0] -= n
                state.fill[i] += n
                fed += n
        live = [i for i, (p, _) in state.busy.items() if p == 0]  # with the rows whose prompt just ended
        if filling or live:
            steps = max([min(decode_chunk, state.busy[i][1]) for i in live], default=0)
            dt = decode_call(float(sum(state.fill[i] for i in live)), len(live), steps)
            t, decode, prefill = t + (dt + piece).seconds, decode + dt, prefill + piece
            calls, sampled = calls + 1, sampled + steps * len(live)
            for i in live:
                n = min(decode_chunk, state.busy[i][1])
                state.busy[i][1] -= n
                state.fill[i] += n
                if state.busy[i][1] == 0:  # the reply leaves; the dialogue waits for its user
                    del state.busy[i]
                    state.used[state.row_of[i]], state.fill[i] = t, state.fill[i] + CLOSING
                    end = sim.finish(t, requests(int(turn[i]), int(turns[i])), servers)
                    turn[i] += 1
                    if turn[i] < turns[i]:
                        heapq.heappush(waiting, (end, i))
        elif waiting:
            t = max(t, waiting[0][0])
    return RolloutTime(max([t] + servers), decode, prefill, calls, sampled, fed)


def static(d: Dialogues, groups: int, call: Callable[[int], Terms], sim: Simulator) -> RolloutTime:
    """The static engine's rollout (module docstring): `call(longest)`, the time of a call whose
    longest reply is `longest` tokens."""
    members = np.array_split(np.arange(len(d.outputs)), max(1, groups))
    servers = [0.0] * max(1, sim.concurrency)
    ready = [(0.0, g, 0) for g in range(len(members)) if len(members[g])]  # (when, group, turn)
    heapq.heapify(ready)
    device, decode = 0.0, Terms()
    calls = sampled = 0
    while ready:
        when, g, k = heapq.heappop(ready)
        rows = [i for i in members[g] if d.turns[i] > k]
        if not rows:
            continue
        longest = int(max(d.outputs[i, k] for i in rows))
        dt = call(longest)
        device = max(device, when) + dt.seconds
        decode, calls, sampled = decode + dt, calls + 1, sampled + longest * len(rows)
        ends = [sim.finish(device, requests(k, int(d.turns[i])), servers) for i in rows]
        if any(d.turns[i] > k + 1 for i in rows):
            heapq.heappush(ready, (max(ends), g, k + 1))
    fed = int(sum(d.contexts[i, k] for i in range(len(d.outputs)) for k in range(int(d.turns[i]))))
    return RolloutTime(max([device] + servers), decode, Terms(), calls, sampled, fed)

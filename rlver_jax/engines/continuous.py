"""`ContinuousEngine`: the rollout engine on the trainer's parameters (continuous batching).

A fixed set of KV-cache rows (rlver_jax.sampling.kv_rows), each holding one dialogue's history
between its turns. A turn enters the moment its dialogue asks for it (`act`), into its own row
(the tokens its prompt shares with what the row holds are kept; the rest is written from the
first slot that differs) or a free one. Each call runs `decode_chunk` decode steps over the rows
with something to do, its first step also feeding up to `prefill_chunk` new prompt tokens of each
row entering a turn, beside the decoding rows in the same forward: a long prompt enters over
several calls and no decoding row stalls while it does; a row whose prompt ends in a call draws
its first token there and decodes in the same call's next steps. A reply goes back to its
dialogue at the end of the call it stopped in, while the others keep decoding.

Dispatch runs ahead of the device: the rows' decoding state stays on the device (kv_rows.RowState),
so the next call is dispatched before this one's tokens are read (its decoding rows go on from the
device's state; one that stopped is no longer live there), and the host reads a call's tokens,
returns its replies and admits new turns while the next call runs. A turn admitted meanwhile
enters in the call after.

A call runs over the rows with something to do, padded to a power of four (every row, gathering
nothing, once that is all of them), so a row that waits for its simulator costs nothing. Rows are
powers of two, calls and prefill pieces powers of four (`call_size`, `chunk_width`), and the rows
hold the slots a dialogue can need from the start (EngineSettings.slots_for; a row is read to its
fill): few programs.

Versions: a turn samples with the parameters `publish` gave its version (rollout.versions:
`Published.resolve`); the rows in flight share one version, so a turn of another version waits
until they have stopped (first come, first served: a waiting turn of another version stops
further turns of the current one from entering). A row is owned by (episode, version): a row
written with other parameters is written afresh.

Tokens: a turn's key is fold_in(fold_in(rng, dialogue), turn) (engines.static's) and reply
column c is drawn from fold_in(key, c), so a dialogue's tokens are those of
`generation.generate` on its prompt, whatever it shares the device with and whenever it enters.
Every device call is dispatched and read in a worker thread, one at a time, so the event loop
keeps serving the simulator meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time
from typing import Any

import jax
import numpy as np

from rlver_jax.engines.published import Published
from rlver_jax.engines.seam import PolicyTurn, TurnRequest
from rlver_jax.engines.table import EngineSettings
from rlver_jax.engines.turns import own_copy, policy_turn, raw_key, sampler_settings, turn_keys
from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config
from rlver_jax.sampling import kv_rows as programs
from rlver_jax.sampling.buckets import MIN_PROMPT_BUCKET, bucket
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.text.chat import ChatTokens


@dataclasses.dataclass
class _Turn:
    """A turn in the engine: waiting for a row, then fed its prompt, then drawing its reply."""

    request: TurnRequest
    version: int
    params: Any
    key: np.ndarray  # raw uint32 [2]
    future: asyncio.Future
    row: int = -1
    pending: list[int] = dataclasses.field(default_factory=list)  # prompt tokens not yet dispatched into the row
    tokens: list[int] = dataclasses.field(default_factory=list)  # reply tokens read so far
    logprobs: list[float] = dataclasses.field(default_factory=list)
    drawing: bool = False  # its whole prompt is dispatched: it draws its reply from that call on
    done: bool = False  # its reply went back

    @property
    def limit(self) -> int:
        return self.request.max_new_tokens


@dataclasses.dataclass
class _Row:
    owner: tuple[int, int] | None = None  # (episode, version)
    session: int = -1
    tokens: list[int] = dataclasses.field(default_factory=list)  # what the cache holds, in order, as far as read
    turn: _Turn | None = None
    used: int = 0  # when it last took a turn (least recently used rows are taken first)


@dataclasses.dataclass
class _Call:
    """A dispatched call, read once the next one is dispatched: its outputs (device arrays), each
    turn it served and the turn's place among its rows, and when it was dispatched."""

    out: programs.Chunk
    ran: jax.Array
    turns: list[tuple[_Turn, int]]
    dispatched: float


@dataclasses.dataclass
class EngineStats:
    """What the engine did (benchmarks/rollout.py reads it): device seconds, decode steps, and per
    reply the decode steps of its call after its last token (0: it stopped at the call's end)."""

    busy_s: float = 0.0
    # (start, end, steps) of each call on the device: from its dispatch or the previous call's end,
    # whichever is later, to its outputs' arrival
    calls: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)
    decode_steps: int = 0
    prefilled_tokens: int = 0  # prompt tokens written into rows (what rows kept between turns is not)
    useful_tokens: int = 0
    reply_lag_steps: list[int] = dataclasses.field(default_factory=list)
    reply_calls: list[int] = dataclasses.field(default_factory=list)  # each reply's call (an index of `calls`)


class ContinuousEngine:
    """Samples turns on published parameters with continuous batching (the module docstring)."""

    def __init__(self, model_cfg: Qwen2Config, chat_tokens: ChatTokens, settings: SamplingSettings,
                 engine: EngineSettings, rng: jax.Array):
        self.model_cfg, self.chat = model_cfg, chat_tokens
        self.settings = sampler_settings(settings, chat_tokens)
        self.engine = engine
        self.published = Published()
        self.stats = EngineStats()
        self._rng = raw_key(rng)
        self._rows: list[_Row] = []
        self._cache: qwen2.KVCache | None = None
        self._state: programs.RowState | None = None
        self._ready = 0.0  # when the last call read was done on the device
        self._waiting: collections.deque[_Turn] = collections.deque()
        self._serving: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._device_lock = threading.Lock()
        self._clock = 0

    # ------------------------------------------------------------------ the sampler seam

    def publish(self, version: int, params: Any, *, private: bool = False) -> None:
        """The parameters of `version` (this process's sampling copy) for the turns that want it
        (engines.seam.Engine.publish)."""
        self.published.put(version, own_copy(params) if private else params)

    def reseed(self, rng: jax.Array) -> None:
        """Turns from now on draw from `rng` (a training batch's key); the rows' caches are dropped."""
        self._rng = raw_key(rng)
        for row in self._rows:
            if row.turn is None:
                row.owner, row.session, row.tokens = None, -1, []

    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    def release(self, session: int) -> None:
        for row in self._rows:
            if row.session == session and row.turn is None:
                row.owner, row.session, row.tokens = None, -1, []

    # ------------------------------------------------------------------ host scheduling

    async def _one(self, request: TurnRequest) -> PolicyTurn:
        version, params = await asyncio.to_thread(self.published.resolve, request.version)
        key = np.asarray(turn_keys(self._rng, np.array([request.dialogue], np.int32),
                                   np.array([request.turn], np.int32)))[0]
        loop = asyncio.get_running_loop()
        turn = _Turn(request, version, params, key, loop.create_future())
        self._waiting.append(turn)
        if self._serving is None or self._serving.done():
            self._wake = asyncio.Event()
            self._serving = loop.create_task(self._serve())
        self._wake.set()
        try:
            return await turn.future
        except asyncio.CancelledError:
            self._drop(turn)
            raise

    def _drop(self, turn: _Turn) -> None:
        """A cancelled turn: out of the queue, its row freed (its cache no longer trusted)."""
        if turn in self._waiting:
            self._waiting.remove(turn)
        if turn.row >= 0 and self._rows[turn.row].turn is turn:
            self._rows[turn.row] = _Row()

    def _in_flight(self) -> list[_Turn]:
        return [row.turn for row in self._rows if row.turn is not None]

    async def _serve(self) -> None:
        """Admit, dispatch the next call, read the one before it; until no turn is waiting, in flight
        or in a call not yet read."""
        call: _Call | None = None
        try:
            while self._waiting or self._in_flight() or call is not None:
                self._admit()
                flight = [t for t in self._in_flight() if t.pending or t.drawing]
                following = await self._device(self._dispatch, flight) if flight else None
                if call is not None:
                    await self._device(self._read, call)
                elif following is None:  # every waiting turn wants a row that is not there yet
                    self._wake.clear()
                    await self._wake.wait()
                call = following
        except Exception as e:  # every turn in the engine fails with it (a cancelled loop: its turns are cancelled)
            for turn in list(self._waiting) + self._in_flight():
                if not turn.future.done():
                    turn.future.set_exception(e)
            self._waiting.clear()
            self._rows, self._cache, self._state = [], None, None
            raise

    async def _device(self, work, *args):
        return await asyncio.to_thread(self._locked, work, *args)

    def _locked(self, work, *args):
        # A serving task cancelled with its event loop leaves its work running: the next waits for it.
        with self._device_lock:
            return work(*args)

    def _admit(self) -> None:
        """Give waiting turns rows, first come first served, of the version in flight."""
        flight = self._in_flight()
        version = flight[0].version if flight else (self._waiting[0].version if self._waiting else None)
        while self._waiting and self._waiting[0].version == version:
            turn = self._waiting[0]
            row = self._row_for(turn)
            if row is None:
                return
            self._waiting.popleft()
            self._enter(turn, row)

    def _row_for(self, turn: _Turn) -> int | None:
        """Its own row, else a free one, else the least recently used idle one, else a new one."""
        owner = (turn.request.episode, turn.version)
        idle = [i for i, r in enumerate(self._rows) if r.turn is None]
        for i in idle:
            if self._rows[i].owner == owner:
                return i
        free = [i for i in idle if self._rows[i].owner is None]
        if free:
            return free[0]
        limit = self.engine.engine_rows
        if not limit or len(self._rows) < limit:
            self._grow(rows=min(bucket(len(self._rows) + 1), limit or 1 << 30))
            return self._row_for(turn)
        return min(idle, key=lambda i: self._rows[i].used) if idle else None

    def _enter(self, turn: _Turn, index: int) -> None:
        row, prompt = self._rows[index], turn.request.prompt_ids
        owner = (turn.request.episode, turn.version)
        if row.owner != owner:
            row.tokens = []
        shared = 0
        for a, b in zip(row.tokens, prompt):
            if a != b:
                break
            shared += 1
        shared = min(shared, len(prompt) - 1)  # the prompt's last token is fed again: its logits draw column 0
        row.owner, row.session, row.turn = owner, turn.request.session, turn
        row.tokens = row.tokens[:shared]
        self._clock += 1
        row.used = self._clock
        turn.row, turn.pending = index, list(prompt[shared:])
        needed = len(prompt) + turn.limit
        if self._cache is None or needed > self._cache.mask.shape[1]:
            self._grow(slots=self.engine.slots_for(needed))

    def _grow(self, rows: int = 0, slots: int = 0) -> None:
        rows, slots = max(rows, len(self._rows)), max(slots, 0 if self._cache is None else self._cache.mask.shape[1])
        slots = slots or self.engine.slots_for(MIN_PROMPT_BUCKET)
        self._rows += [_Row() for _ in range(rows - len(self._rows))]
        if self._cache is None:
            self._cache, self._state = qwen2.init_cache(self.model_cfg, rows, slots), programs.init_state(rows)
        elif (rows, slots) != self._cache.mask.shape:
            self._cache, self._state = programs.resize(self._cache, self._state, rows, slots)

    # ------------------------------------------------------------------ device calls (worker thread)

    def _call_rows(self, turns: list[_Turn]) -> tuple[np.ndarray | None, list[int]]:
        """The rows a call runs over, and each turn's place among them: the turns' rows padded to
        `call_size` (padding: past the rows), or None (every row, in order)."""
        r = len(self._rows)
        b = call_size(len(turns), r)
        if b >= r:
            return None, [t.row for t in turns]
        rows = np.full(b, r, np.int32)
        rows[:len(turns)] = [t.row for t in turns]
        return rows, list(range(len(turns)))

    def _feed(self, fed: list[tuple[_Turn, int]], b: int) -> programs.Feed:
        """The call's prefill piece: each fed turn's next prompt tokens (at most prefill_chunk), from
        its row's fill; a piece that ends its prompt draws column 0 (the turn draws from now on)."""
        p = call_size(len(fed), b)
        width = chunk_width(max(len(t.pending) for t, _ in fed), self.engine.prefill_chunk)
        place, starts, counts, limits = np.full(p, b, np.int32), *(np.zeros(p, np.int32) for _ in range(3))
        ids, keys = np.full((p, width), self.settings.pad_id, np.int32), np.zeros((p, 2), np.uint32)
        for k, (t, i) in enumerate(fed):
            row, piece = self._rows[t.row], t.pending[:min(width, self.engine.prefill_chunk)]
            place[k], starts[k], counts[k], keys[k], ids[k, :len(piece)] = i, len(row.tokens), len(piece), t.key, piece
            row.tokens += piece
            t.pending = t.pending[len(piece):]
            t.drawing = not t.pending
            limits[k] = max(t.limit, 1) if t.drawing else 0  # a reply has at least one token
        self.stats.prefilled_tokens += int(counts.sum())
        return programs.Feed(place, starts, ids, counts, keys, limits)

    def _dispatch(self, flight: list[_Turn]) -> _Call:
        """Dispatch a call over the turns with something to do (a prompt piece to feed, or a reply to
        draw), without waiting for the device."""
        rows, place = self._call_rows(flight)
        b = len(self._rows) if rows is None else len(rows)
        serving = np.zeros(b, bool)
        serving[place] = True
        fed = [(t, i) for t, i in zip(flight, place) if t.pending]
        feed = self._feed(fed, b) if fed else None
        self._cache, self._state, out, ran = programs.chunk(
            self.model_cfg, self.settings, flight[0].params, self._cache, self._state, rows=rows, serving=serving,
            feed=feed, steps=self.engine.decode_chunk)
        return _Call(out, ran, list(zip(flight, place)), time.perf_counter())

    def _read(self, call: _Call) -> None:
        """A call's tokens (waiting for the device): each drawing turn's new ones; a turn that stopped
        leaves its row and goes back."""
        tokens, logprobs, emitted, ran = jax.device_get((call.out.tokens, call.out.model_logprobs,
                                                         call.out.emitted, call.ran))
        ready = time.perf_counter()
        start, self._ready = max(call.dispatched, self._ready), ready
        self.stats.busy_s += ready - start
        self.stats.calls.append((start, ready, int(ran)))
        self.stats.decode_steps += int(ran)
        for t, i in call.turns:
            n = int(emitted[i])
            if t.done or not n or self._rows[t.row].turn is not t:  # nothing drawn, or cancelled meanwhile
                continue
            new = tokens[i, :n].tolist()
            # Fed this call: the last token before it (when the reply had begun) and every new one but the last.
            self._rows[t.row].tokens += t.tokens[-1:] + new[:-1]
            self._emit(t, new, logprobs[i, :n].tolist(), lag=int(ran) - n)

    def _emit(self, turn: _Turn, tokens: list[int], logprobs: list[float], lag: int) -> None:
        """Append a call's tokens to the turn; a turn that stopped leaves its row and goes back."""
        turn.tokens += tokens
        turn.logprobs += logprobs
        if turn.tokens[-1] not in self.settings.stop_ids and len(turn.tokens) < turn.limit:
            return
        turn.done = True
        self._rows[turn.row].turn = None
        self.stats.useful_tokens += len(turn.tokens)
        self.stats.reply_lag_steps.append(lag)
        self.stats.reply_calls.append(len(self.stats.calls) - 1)
        result = policy_turn(self.chat, turn.tokens, turn.logprobs, reencoded=False, version=turn.version)
        turn.future.get_loop().call_soon_threadsafe(_settle, turn.future, result)


def call_size(turns: int, rows: int) -> int:
    """The rows of a call for `turns` turns among `rows`: the next power of four, at most every row."""
    size = 1
    while size < turns:
        size *= 4
    return min(size, rows)


def chunk_width(tokens: int, prefill_chunk: int) -> int:
    """The width of a prefill call whose longest feed is `tokens` (at most `prefill_chunk` of them
    per call): a power of four from MIN_PROMPT_BUCKET."""
    width = MIN_PROMPT_BUCKET
    while width < min(tokens, prefill_chunk):
        width *= 4
    return width


def _settle(future: asyncio.Future, result: PolicyTurn) -> None:
    if not future.done():  # a cancelled turn's reply is dropped
        future.set_result(result)

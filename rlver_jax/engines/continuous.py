"""`ContinuousEngine`: the rollout engine on the trainer's parameters (continuous batching, issue 53).

A fixed set of KV-cache rows (rlver_jax.sampling.kv_rows), each holding one dialogue's history
between its turns. A turn enters the moment its dialogue asks for it (`act`), into its own row
(the tokens its prompt shares with what the row holds are kept; the rest is written from the
first slot that differs) or a free one; its new tokens are prefilled in chunks of at most
`prefill_chunk` tokens, one chunk call between decode chunks, so a long prompt never stalls the
rows that are decoding; decode runs `decode_chunk` steps at a time over the live rows, and a reply
goes back to its dialogue at the end of the chunk it stopped in, while the others keep decoding.
A call runs over the rows with something to do, padded to a power of four (every row, gathering
nothing, once that is all of them), so a row that waits for its simulator costs nothing. Rows are
powers of two, calls and prefill chunks powers of four (`call_size`, `chunk_width`), the rows'
slots grow by the length buckets up to what a dialogue can need (EngineSettings.slots_for): few
programs.

Versions: a turn samples with the parameters `publish` gave its version (rollout.versions:
`Published.resolve`); the rows in flight share one version, so a turn of another version waits
until they have stopped (first come, first served: a waiting turn of another version stops
further turns of the current one from entering). A row is owned by (episode, version): a row
written with other parameters is written afresh.

Tokens: a turn's key is fold_in(fold_in(rng, dialogue), turn) (engines.static's) and reply
column c is drawn from fold_in(key, c), so a dialogue's tokens are those of
`generation.generate` on its prompt, whatever it shares the device with and whenever it enters.
Every device call runs in a worker thread, one at a time, so the event loop keeps serving the
simulator meanwhile.
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
    """A turn in the engine: waiting for a row, then prefilling, then decoding."""

    request: TurnRequest
    version: int
    params: Any
    key: np.ndarray  # raw uint32 [2]
    future: asyncio.Future
    row: int = -1
    pending: list[int] = dataclasses.field(default_factory=list)  # prompt tokens not yet in the row
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    live: bool = False  # decoding

    @property
    def limit(self) -> int:
        return self.request.max_new_tokens


@dataclasses.dataclass
class _Row:
    owner: tuple[int, int] | None = None  # (episode, version)
    session: int = -1
    tokens: list[int] = dataclasses.field(default_factory=list)  # what the cache holds, in order
    turn: _Turn | None = None
    used: int = 0  # when it last took a turn (least recently used rows are taken first)


@dataclasses.dataclass
class EngineStats:
    """What the engine did (benchmarks/rollout.py reads it): device seconds, decode steps, and per
    reply the decode steps of its chunk after its last token (0: it stopped at the chunk's end)."""

    busy_s: float = 0.0
    calls: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (start, end) of each device call
    decode_steps: int = 0
    prefilled_tokens: int = 0  # prompt tokens written into rows (what rows kept between turns is not)
    useful_tokens: int = 0
    reply_lag_steps: list[int] = dataclasses.field(default_factory=list)


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
        """Admit, prefill one chunk, decode one chunk; until no turn is waiting or in flight."""
        try:
            while self._waiting or self._in_flight():
                self._admit()
                flight = self._in_flight()
                if not flight:  # every waiting turn wants a row that is not there yet
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if any(t.pending for t in flight):
                    await self._device(self._prefill, flight)
                if any(t.live for t in self._in_flight()):
                    await self._device(self._decode, self._in_flight())
        except Exception as e:  # every turn in the engine fails with it (a cancelled loop: its turns are cancelled)
            for turn in list(self._waiting) + self._in_flight():
                if not turn.future.done():
                    turn.future.set_exception(e)
            self._waiting.clear()
            self._rows, self._cache = [], None
            raise

    async def _device(self, call, flight: list[_Turn]) -> None:
        start = time.perf_counter()
        params = flight[0].params
        await asyncio.to_thread(self._locked, call, params, flight)
        end = time.perf_counter()
        self.stats.busy_s += end - start
        self.stats.calls.append((start, end))

    def _locked(self, call, params: Any, flight: list[_Turn]) -> None:
        # A serving task cancelled with its event loop leaves its call running: the next waits for it.
        with self._device_lock:
            call(params, flight)

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
        slots = slots or MIN_PROMPT_BUCKET
        self._rows += [_Row() for _ in range(rows - len(self._rows))]
        if self._cache is None:
            self._cache = qwen2.init_cache(self.model_cfg, rows, slots)
        elif (rows, slots) != self._cache.mask.shape:
            self._cache = programs.resize(self._cache, rows, slots)

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

    def _prefill(self, params: Any, flight: list[_Turn]) -> None:
        fed = [t for t in flight if t.pending]
        rows, place = self._call_rows(fed)
        b = len(self._rows) if rows is None else len(rows)
        width = chunk_width(max(len(t.pending) for t in fed), self.engine.prefill_chunk)
        # Rows with nothing to feed start at their fill: nothing cleared, nothing real written.
        starts = np.array([len(row.tokens) for row in self._rows] if rows is None else [0] * b, np.int32)
        counts, ids = np.zeros(b, np.int32), np.full((b, width), self.settings.pad_id, np.int32)
        keys = np.zeros((b, 2), np.uint32)
        for t, i in zip(fed, place):
            piece = t.pending[:min(width, self.engine.prefill_chunk)]
            starts[i], counts[i], keys[i], ids[i, :len(piece)] = len(self._rows[t.row].tokens), len(piece), t.key, piece
        self._cache, draw = programs.prefill(self.model_cfg, self.settings, params, self._cache, rows=rows,
                                             starts=starts, ids=ids, counts=counts, keys=keys)
        tokens, logprobs = jax.device_get((draw.tokens, draw.model_logprobs))
        self.stats.prefilled_tokens += int(counts.sum())
        for t, i in zip(fed, place):
            n = int(counts[i])
            self._rows[t.row].tokens += t.pending[:n]
            t.pending = t.pending[n:]
            if not t.pending:  # the prompt is in: column 0 is drawn
                self._emit(t, [int(tokens[i])], [float(logprobs[i])], lag=0)

    def _decode(self, params: Any, flight: list[_Turn]) -> None:
        live = [t for t in flight if t.live]
        rows, place = self._call_rows(live)
        b = len(self._rows) if rows is None else len(rows)
        # A row with no reply in progress (limit 0) writes, masked out, at its first free slot.
        lengths = np.array([len(row.tokens) for row in self._rows] if rows is None else [0] * b, np.int32)
        last, columns, limits = (np.zeros(b, np.int32) for _ in range(3))
        keys = np.zeros((b, 2), np.uint32)
        for t, i in zip(live, place):
            lengths[i], last[i], columns[i] = len(self._rows[t.row].tokens), t.tokens[-1], len(t.tokens)
            limits[i], keys[i] = t.limit, t.key
        self._cache, chunk, ran = programs.decode(self.model_cfg, self.settings, params, self._cache, rows=rows,
                                                  last=last, lengths=lengths, columns=columns, limits=limits,
                                                  keys=keys, steps=self.engine.decode_chunk)
        tokens, logprobs, emitted, ran = jax.device_get((chunk.tokens, chunk.model_logprobs, chunk.emitted, ran))
        self.stats.decode_steps += int(ran)
        for t, i in zip(live, place):
            n = int(emitted[i])
            new = tokens[i, :n].tolist()
            # Fed this chunk: the last token before it and every new one but the last.
            self._rows[t.row].tokens += [t.tokens[-1]] + new[:-1]
            self._emit(t, new, logprobs[i, :n].tolist(), lag=int(ran) - n)

    def _emit(self, turn: _Turn, tokens: list[int], logprobs: list[float], lag: int) -> None:
        """Append a call's tokens to the turn; a turn that stopped leaves its row and goes back."""
        turn.tokens += tokens
        turn.logprobs += logprobs
        stopped = turn.tokens[-1] in self.settings.stop_ids
        turn.live = not stopped and len(turn.tokens) < turn.limit
        if turn.live:
            return
        row = self._rows[turn.row]
        row.turn = None
        self.stats.useful_tokens += len(turn.tokens)
        self.stats.reply_lag_steps.append(lag)
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

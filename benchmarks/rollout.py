r"""Rollout benchmark (issues 6, 41 and 53): batched, pipelined dialogues vs a sequential per-dialogue loop;
lockstep rounds vs per-dialogue progress under heavy-tailed simulator latency; the rollout engine
(continuous batching) vs static calls with replies of varied length.

  .venv/bin/python benchmarks/rollout.py --engines=static
  .venv/bin/python benchmarks/rollout.py --engines=static --sequential_dialogues=0   # time the whole baseline
  .venv/bin/python benchmarks/rollout.py --engines=static --latency_s=2.5 --latency_log_sd=0,0.75,1.0 \
      --batch_wait_s=inf,0.05,0.25 --pipeline_groups=1 --max_new_tokens=48 --sequential_dialogues=-1   # issue 41
  .venv/bin/python benchmarks/rollout.py --engines=continuous,static --reply_lengths=budget,lognormal \
      --pipeline_groups=1 --batch_wait_s=0.25 --sequential_dialogues=-1   # issue 53

32 dialogues x 8 policy turns of the tiny random Qwen2 (StaticEngine, think=False) against the scripted
OpenAI-compatible test server (rlver_jax/testing/scripted_server.py) through the real openai
simulator backend; the server sleeps `latency_s` per request. The simulator answers "Change: 0" and
a neutral line without farewells, and format failures (an empty random reply) continue, so every
dialogue runs all turns: the emotion step every turn, the reply step on all but the last.

  ours: EpisodeRunner.run on each sampler of --engines (engines.table): "static" once per
    --latency_log_sd, --pipeline_groups and --batch_wait_s value (rollout.batch_wait_s: inf is
    lockstep rounds, a finite wait per-dialogue progress); "continuous", the rollout engine, once per
    --latency_log_sd (it takes each dialogue's turn as it comes: no groups, no wait); each once per
    --reply_lengths value.
  sequential: the reference RLVER loop, for each turn, for each dialogue, a batch-of-one policy
    generation and then that dialogue's blocking simulator calls. It takes dialogues x turns x 2 x
    latency (~150 s) plus generation, so by default it runs on --sequential_dialogues dialogues
    spread over the set and is extrapolated linearly (its cost is a sum of per-dialogue costs).

Latency: each request sleeps a lognormal time of mean --latency_s and log-sd --latency_log_sd (0:
constant), drawn from a hash of the request's messages, so every schedule meets the same latencies.
The critical-path bound of a run is what no schedule on one device can beat by much: the slowest
dialogue's own simulator steps (timed per dialogue) plus its turns' generation, each turn at the
run's median device-call time.

Reply lengths: "budget", each reply runs to a stop token or max_new_tokens; "constant", each reply
is ended at max_new_tokens / 4 tokens; "lognormal", at a length drawn from a lognormal of that mean
and log-sd --reply_length_log_sd (at most max_new_tokens), a function of (dialogue, turn), so both
samplers write the same replies (their request's token budget; a static call stops once each row
has reached its own). Useful tokens: the replies' tokens; per busy second (the device's rate while
it works) and per wall second; `vs constant`, the busy rate over the same sampler's with constant
lengths (the same tokens in all). A reply's wait: from its last token to its return, in decode steps
converted to seconds at its call's rate (static: the call's longest row minus its own length; the
engine: the rest of its decode chunk).

Spread: every timed run is repeated --repeats times (the repeats interleaved, so each setting
meets the machine's load alike) and each figure is printed as the median of its runs with their
range, [lowest, highest]; `vs constant` pairs each run with the constant-length run of the same
repeat. The sequential baseline runs once.

Generation time is the union of the intervals spent in the policy's device calls (concurrent
pipeline groups queue on the policy's device lock, inside the running call's interval; the
engine's: from a call's dispatch, or the previous call's end when later, to its tokens' arrival,
its calls dispatched ahead of the device). Every
generation program the timed runs can need is compiled beforehand, a zero-latency rollout warms
the rest, and the number of compilations during timing is printed (it should be 0).
Targets: ours >= 10x faster than sequential, and ours' wall time <= 1.5 x (turns x 2 x latency +
generation time).
"""

import asyncio
import dataclasses
import hashlib
import json
import logging
import math
import pathlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from configs.simulator import get_simulator_config  # noqa: E402
from rlver_jax.engines.continuous import ContinuousEngine, call_size, chunk_width  # noqa: E402
from rlver_jax.engines.seam import PolicyTurn, TurnRequest  # noqa: E402
from rlver_jax.engines.static import StaticEngine  # noqa: E402
from rlver_jax.engines.table import ENGINES, EngineSettings  # noqa: E402
from rlver_jax.models import qwen2  # noqa: E402
from rlver_jax.models.config import get_preset  # noqa: E402
from rlver_jax.rollout.episodes import EpisodeRequest, EpisodeRunner, RolloutSettings  # noqa: E402
from rlver_jax.rollout.prompts import system_prompt  # noqa: E402
from rlver_jax.rollout.sequence import DialogueSequence  # noqa: E402
from rlver_jax.rollout.versions import VersionSchedule  # noqa: E402
from rlver_jax.sampling import generation  # noqa: E402
from rlver_jax.sampling import kv_rows as engine_programs  # noqa: E402
from rlver_jax.sampling.buckets import LENGTH_BUCKETS, bucket  # noqa: E402
from rlver_jax.sampling.cache_bound import row_slots  # noqa: E402
from rlver_jax.sampling.settings import SamplingSettings  # noqa: E402
from rlver_jax.simulator import SimulatorSettings, build_simulator  # noqa: E402
from rlver_jax.simulator.agent import DialogueState  # noqa: E402
from rlver_jax.simulator.profiles import load_profiles  # noqa: E402
from rlver_jax.testing.scripted_server import Reply, ScriptedServer, route  # noqa: E402
from rlver_jax.text import chat  # noqa: E402
from rlver_jax.text.tiny_tokenizer import build_tiny_tokenizer  # noqa: E402

_DIALOGUES = flags.DEFINE_integer("dialogues", 32, "Dialogues per rollout.")
_TURNS = flags.DEFINE_integer("turns", 8, "Policy turns per dialogue (config.simulator.max_turns).")
_LATENCY = flags.DEFINE_float("latency_s", 0.3, "Simulator server sleep per request.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 32, "Policy tokens per turn.")
_GROUPS = flags.DEFINE_list("pipeline_groups", ["1", "2", "4"], "rollout.pipeline_groups values.")
_SEQUENTIAL = flags.DEFINE_integer(
    "sequential_dialogues", 4, "Dialogues the sequential baseline runs (extrapolated to all); 0: all; < 0: none.")
_LOG_SD = flags.DEFINE_list("latency_log_sd", ["0"], "Log-sd of the lognormal request latency (0: constant).")
_WAITS = flags.DEFINE_list("batch_wait_s", ["inf", "0.25"], "rollout.batch_wait_s values (inf: lockstep rounds).")
_SEED = flags.DEFINE_integer("seed", 0, "Parameter and sampling seed.")
_CACHE_SLOTS = flags.DEFINE_integer(
    "cache_slots", 16384, "Static: KV-cache slots kept per dialogue between turns (0: re-encode every turn).")
_ENGINES = flags.DEFINE_list("engines", ["static"], f"Engines (config.rollout.engine): {ENGINES.words()}.")
_LENGTHS = flags.DEFINE_list("reply_lengths", ["budget"], "budget: replies to a stop or max_new_tokens; constant: "
                             "each ended at max_new_tokens / 4; lognormal: at a lognormal length of that mean.")
_LENGTH_LOG_SD = flags.DEFINE_float("reply_length_log_sd", 1.0, "Log-sd of the lognormal reply lengths.")
_DECODE_CHUNK = flags.DEFINE_integer("decode_chunk", 8, "continuous: config.rollout.decode_chunk.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs of each setting (figures: their median and range).")
_MAX_TOTAL = 8192  # config.rollout.max_total_tokens of the dialogues: no dialogue here reaches it

# Scripted simulator answers: no emotion change and no farewell, so no dialogue ends early.
_EMOTION_ANSWER = "Analysis: the reply is neither helpful nor hurtful.\nChange: 0"
_REPLY_ANSWER = "Plan: keep talking.\nResponse: I see. Tell me more about it."
_USER_LINE = "I see. Tell me more about it."


def _union(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of the intervals (calls waiting on a lock overlap the running one)."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


class Recorded:
    """What a sampler did: its device calls' (start, end), each reply's wait after its last token
    (seconds) and its tokens, each turn's (start, end) from its request to its reply."""

    def __init__(self):
        self.intervals: list[tuple[float, float]] = []
        self.waits: list[float] = []
        self.turns: list[tuple[float, float]] = []
        self.tokens = 0

    def clear(self) -> None:
        self.__init__()

    def busy_seconds(self) -> float:
        return _union(self.intervals)


def _record_turns(policy) -> None:
    """Time each act() of `policy` (per request) and count its replies' tokens."""
    act = policy.act

    async def timed_act(requests: list[TurnRequest]) -> list[PolicyTurn]:
        start = time.perf_counter()
        turns = await act(requests)
        end = time.perf_counter()
        policy.recorded.turns += [(start, end)] * len(turns)
        policy.recorded.tokens += sum(len(t.token_ids) for t in turns)
        return turns

    policy.act = timed_act


class TimedPolicy(StaticEngine):
    """The static sampler, recording its device calls and each reply's wait for its call's longest row."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorded = Recorded()
        _record_turns(self)

    def _generate(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        start = time.perf_counter()
        try:
            turns = super()._generate(requests)
        finally:
            end = time.perf_counter()
            self.recorded.intervals.append((start, end))
        steps = max(len(t.token_ids) for t in turns)
        self.recorded.waits += [(steps - len(t.token_ids)) / steps * (end - start) for t in turns]
        return turns


class TimedEngine(ContinuousEngine):
    """The rollout engine, recording its calls (engines.continuous: each call's device interval) and
    each reply's wait for the end of its call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorded = Recorded()
        _record_turns(self)

    def _read(self, call) -> None:
        lags = len(self.stats.reply_lag_steps)
        super()._read(call)
        start, end, steps = self.stats.calls[-1]
        self.recorded.intervals.append((start, end))
        self.recorded.waits += [lag / max(steps, 1) * (end - start) for lag in self.stats.reply_lag_steps[lags:]]


class VariedLengths(EpisodeRunner):
    """Ends each reply at max_new_tokens / 4 tokens ("constant") or at a length drawn from a
    lognormal of that mean ("lognormal"), its token budget, a function of (dialogue, turn): every
    sampler writes the same replies. "budget": replies run to a stop token or max_new_tokens."""

    lengths = "budget"

    def _turn_request(self, episode, versions):
        request = super()._turn_request(episode, versions)
        if self.lengths == "budget":
            return request
        mean = self.settings.max_new_tokens / 4
        drawn = mean
        if self.lengths == "lognormal":
            rng = np.random.default_rng([request.dialogue, request.turn, 53])
            drawn = rng.lognormal(math.log(mean) - _LENGTH_LOG_SD.value ** 2 / 2, _LENGTH_LOG_SD.value)
        return dataclasses.replace(request, max_new_tokens=max(1, min(int(round(drawn)), request.max_new_tokens)))


class Latency:
    """Per-request server latency: lognormal of mean `mean_s` and log-sd `log_sd` (0: constant), a
    function of the request's messages."""

    def __init__(self):
        self.mean_s, self.log_sd = 0.0, 0.0

    def __call__(self, request: dict) -> float:
        if self.log_sd == 0 or self.mean_s == 0:
            return self.mean_s
        digest = hashlib.sha256(json.dumps(request["messages"], sort_keys=True).encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        return float(rng.lognormal(math.log(self.mean_s) - self.log_sd ** 2 / 2, self.log_sd))


class TimedSimulator:
    """The simulator, timing each dialogue's steps (a dialogue: the chain of states from an opening)."""

    def __init__(self, simulator):
        self.simulator = simulator
        self.steps: list[list[float]] = []  # per dialogue, its steps' seconds
        self._chains: dict[int, tuple[int, DialogueState]] = {}  # id(state) -> its dialogue (state kept alive)

    def clear(self) -> None:
        self.steps, self._chains = [], {}

    async def start(self, profile):
        return await self.simulator.start(profile)

    async def respond(self, state: DialogueState, reply: str) -> DialogueState:
        start = time.perf_counter()
        new = await self.simulator.respond(state, reply)
        chain = self._chains[id(state)][0] if id(state) in self._chains else len(self.steps)
        if chain == len(self.steps):  # an opening: a new dialogue (the openings of a group are shared)
            self.steps.append([])
        self.steps[chain].append(time.perf_counter() - start)
        self._chains[id(new)] = (chain, new)
        return new


@dataclasses.dataclass
class Timing:
    name: str
    dialogues: int  # dialogues actually run
    wall_s: float
    generation_s: float
    compiles: int  # generation programs traced during the timed run
    requests: int  # simulator requests the server answered
    peak_in_flight: int
    calls: int = 0  # policy device calls
    call_s: float = 0.0  # their median seconds
    slowest_user_s: float = 0.0  # the most simulator seconds of one dialogue
    # a turn's generation on the critical path: static, the median call; continuous, the median turn
    turn_s: float = 0.0
    tokens: int = 0  # the replies' tokens
    waits: list[float] = dataclasses.field(default_factory=list)  # each reply's wait after its last token

    @property
    def critical_path(self) -> float:
        """The slowest dialogue's own simulator steps plus its turns' generation."""
        return self.slowest_user_s + _TURNS.value * self.turn_s

    @property
    def idle(self) -> float:
        return 1.0 - self.generation_s / self.wall_s

    def scaled(self, dialogues: int) -> "Timing":
        """Linear extrapolation to `dialogues` (the sequential loop's cost is additive)."""
        f = dialogues / self.dialogues
        return dataclasses.replace(self, name=f"{self.name} ({self.dialogues} run, x{f:g})", dialogues=dialogues,
                                   wall_s=self.wall_s * f, generation_s=self.generation_s * f,
                                   requests=round(self.requests * f))


async def sequential(runner: EpisodeRunner, requests: Sequence[EpisodeRequest]) -> list[DialogueSequence]:
    """The baseline: for each turn, for each dialogue, generate for it alone, then await its simulator step.

    It uses the runner's own per-dialogue bookkeeping, so only the scheduling differs from ours.
    """
    versions = VersionSchedule.fixed(0)
    states = [await runner.simulator.start(r.profile) for r in requests]
    episodes = [runner._open(r, s) for r, s in zip(requests, states)]
    while live := [e for e in episodes if not e.done]:
        for e in live:
            request = runner._turn_request(e, versions)
            (turn,) = await runner.policy.act([request])
            reply = runner._record_policy_turn(e, request, turn)
            if reply is not None:
                runner._record_user_turn(e, await runner.simulator.respond(e.state, reply))
    return [runner._finish(e, versions) for e in episodes]


def _compiles() -> int:
    return generation.trace_count() + engine_programs.trace_count()


async def timed(name: str, rollout: Callable[[], Awaitable[list[DialogueSequence]]], policy,
                server: ScriptedServer, turns: int, simulator: TimedSimulator, continuous: bool = False) -> Timing:
    """Runs one rollout, checks that every dialogue ran all turns, and times it."""
    rec = policy.recorded
    rec.clear()
    simulator.clear()
    server.peak_in_flight = 0
    requests, traces = len(server.requests), _compiles()
    start = time.perf_counter()
    seqs = await rollout()
    wall = time.perf_counter() - start
    short = [s.profile_id for s in seqs if s.end_reason != "turn_limit" or len(s.turn_ends) != turns]
    if short or server.errors:
        raise RuntimeError(f"{name}: dialogues ended early {short} or server errors {server.errors}")
    call_s = float(np.median([end - start for start, end in rec.intervals]))
    turn_s = float(np.median([end - start for start, end in rec.turns])) if continuous else call_s
    return Timing(name, len(seqs), wall, rec.busy_seconds(), _compiles() - traces,
                  len(server.requests) - requests, server.peak_in_flight, len(rec.intervals), call_s,
                  max(sum(steps) for steps in simulator.steps), turn_s, rec.tokens, list(rec.waits))


def length_buckets(chat_tokens: chat.ChatTokens, requests: Sequence[EpisodeRequest], turns: int,
                   max_new_tokens: int) -> list[int]:
    """Prompt-length buckets the rollouts can reach: from the shortest first prompt to the longest
    last-turn prompt (every policy turn at its budget, plus its closing template tokens)."""
    header = len(chat_tokens.assistant_header)
    firsts = [len(chat.encode_message(chat_tokens, "system", system_prompt(r.profile.language, False))[0])
              + len(chat.encode_message(chat_tokens, "user", r.profile.first_talk)[0]) + header
              for r in requests]
    per_turn = (max_new_tokens + 1 + len(chat_tokens.newline)
                + len(chat.encode_message(chat_tokens, "user", _USER_LINE)[0]) + header)
    first = bucket(min(firsts), LENGTH_BUCKETS)
    last = bucket(max(firsts) + (turns - 1) * per_turn, LENGTH_BUCKETS)
    return [b for b in LENGTH_BUCKETS if first <= b <= last]


async def precompile(policy: StaticEngine, batch_sizes: set[int], lengths: Sequence[int], pad_id: int) -> None:
    """Traces the generation program of every (batch, prompt length) bucket the timed runs can hit
    (StaticEngine pads prompts to buckets.LENGTH_BUCKETS)."""
    for b in sorted({bucket(n, None) for n in batch_sizes}):
        for length in lengths:
            await policy.act([TurnRequest([pad_id] * length, [], policy.settings.max_new_tokens)] * b)


def precompile_engine(engine: ContinuousEngine, rows: int) -> None:
    """Traces the rollout engine's program at every call size, prefill piece (rows and width) and
    none the timed runs can reach on `rows` rows (engines.continuous; the rows hold the slots a
    dialogue can need from the start)."""
    cfg, settings, params = engine.model_cfg, engine.settings, engine.published.resolve(0)[1]
    sizes = sorted({call_size(n, rows) for n in range(1, rows + 1)})
    widths = sorted({chunk_width(n, engine.engine.prefill_chunk) for n in range(1, engine.engine.prefill_chunk + 1)})
    cache = qwen2.init_cache(cfg, rows, engine.engine.slots_for(1))
    state = engine_programs.init_state(rows)
    for b in sizes:
        feeds = [None] + [engine_programs.Feed(np.full(p, b, np.int32), np.zeros(p, np.int32),
                                               np.zeros((p, w), np.int32), np.zeros(p, np.int32),
                                               np.zeros((p, 2), np.uint32), np.zeros(p, np.int32))
                          for p in sorted({call_size(n, b) for n in range(1, b + 1)}) for w in widths]
        for feed in feeds:
            cache, state, _, _ = engine_programs.chunk(
                cfg, settings, params, cache, state, rows=None if b >= rows else np.full(b, rows, np.int32),
                serving=np.zeros(b, bool), feed=feed, steps=engine.engine.decode_chunk)
    jax.block_until_ready(cache)


def _settings(engines: list[str], groups: list[int], waits: list[float]) -> list[tuple[str, int, float]]:
    """(engine, pipeline groups, batch wait) of each run: the engine takes each turn as it comes."""
    return [(e, g, w) for e in engines for g, w in ([(1, 0.0)] if ENGINES[e].continuous else
                                                     [(g, w) for g in groups for w in waits])]


def _run_name(engine: str, groups: int, wait: float) -> str:
    if ENGINES[engine].continuous:
        return "engine"
    progress = "lockstep" if math.isinf(wait) else f"wait {wait:g} s"
    return f"static, groups={groups}, {progress}"


async def benchmark(runners: dict[str, VariedLengths], seq_runner: EpisodeRunner, requests: list[EpisodeRequest],
                    groups: list[int], waits: list[float], server: ScriptedServer, latency: Latency
                    ) -> tuple[list[Timing], Timing | None]:
    any_runner = next(iter(runners.values()))
    chat_tokens, turns = any_runner.policy.chat, _TURNS.value
    # Spread over the whole list, so that the subset mixes profiles (languages, prompt lengths).
    n_seq = max(0, min(_SEQUENTIAL.value or len(requests), len(requests)))
    seq_requests = [requests[i] for i in np.linspace(0, len(requests) - 1, n_seq).round().astype(int)]
    lengths = length_buckets(chat_tokens, requests, turns, _MAX_NEW_TOKENS.value)
    start = time.perf_counter()
    if _SEQUENTIAL.value >= 0:
        await precompile(seq_runner.policy, {1}, lengths, chat_tokens.im_start)
    for runner in runners.values():  # the engine's, on a row for each dialogue
        if isinstance(runner.policy, ContinuousEngine):
            precompile_engine(runner.policy, bucket(len(requests)))
    # Zero-latency rollouts, one per sampler setting and reply lengths, compile ours' programs and
    # warm the HTTP client, the simulator path and the host code.
    latency.mean_s = 0.0
    settings = _settings(list(runners), groups, waits)
    for reply_lengths in _LENGTHS.value:
        for engine, g, _ in settings:
            runner = runners[engine]
            runner.lengths = reply_lengths
            runner.settings = dataclasses.replace(runner.settings, pipeline_groups=g)
            await runner.run(requests)
    print(f"warm-up (sequential: prompt lengths {lengths}; ours: a zero-latency rollout per setting): "
          f"{time.perf_counter() - start:.1f} s", flush=True)

    latency.mean_s = _LATENCY.value
    ours: dict[str, list[Timing]] = {}
    for repeat in range(_REPEATS.value):
        for reply_lengths in _LENGTHS.value:
            for log_sd in [float(v) for v in _LOG_SD.value]:
                latency.log_sd = log_sd
                shape = f"lognormal {log_sd:g}" if log_sd else "constant"
                for engine, g, wait in settings:
                    runner = runners[engine]
                    runner.lengths = reply_lengths
                    runner.settings = dataclasses.replace(runner.settings, pipeline_groups=g, batch_wait_s=wait)
                    name = f"{shape}, {reply_lengths}, {_run_name(engine, g, wait)}"
                    run = await timed(name, lambda: runner.run(requests), runner.policy, server, turns,
                                      runner.simulator, runner.settings.continuous)
                    ours.setdefault(name, []).append(run)
                    print(f"  {name} (run {repeat + 1}): {run.wall_s:.2f} s", flush=True)
    if _SEQUENTIAL.value < 0:
        return ours, None
    latency.log_sd = 0.0
    seq = await timed("sequential", lambda: sequential(seq_runner, seq_requests), seq_runner.policy, server,
                      turns, seq_runner.simulator)
    print(f"  sequential ({n_seq} dialogues): {seq.wall_s:.2f} s", flush=True)
    return ours, seq


def _median(values: Sequence[float]) -> float:
    return float(np.median(values))


def _spread(values: Sequence[float], digits: int = 2) -> str:
    """The median of `values` and their range: "m [lo, hi]" (one run: its value)."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{_median(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def _median_run(runs: list[Timing]) -> Timing:
    """The run of median wall time (of an even count, the lower middle)."""
    return sorted(runs, key=lambda t: t.wall_s)[(len(runs) - 1) // 2]


def report(ours: dict[str, list[Timing]], seq: Timing | None, dialogues: int) -> None:
    latency_table(ours, dialogues)
    if _LENGTHS.value != ["budget"] or any(ENGINES[e].continuous for e in _ENGINES.value):
        lengths_table(ours)
    if seq is None:
        return
    turns, latency = _TURNS.value, _LATENCY.value
    constant = [_median_run(runs) for name, runs in ours.items() if name.startswith("constant")]
    seq_all = seq.scaled(dialogues) if seq.dialogues != dialogues else seq
    print(f"\n{dialogues} dialogues x {turns} turns, simulator latency {latency * 1e3:.0f} ms/request, "
          f"max_new_tokens {_MAX_NEW_TOKENS.value}, tiny random Qwen2 on {jax.devices()[0].platform}; each setting's "
          f"run of median wall time")
    header = (f"{'run':<36} {'wall s':>8} {'gen s':>7} {'gen ms/turn':>11} {'idle':>6} {'bound s':>8} "
              f"{'wall/bound':>10} {'speed-up':>8} {'requests':>8} {'peak':>5} {'compiles':>8}")
    rows = []
    for t in constant + [seq_all]:
        bound = turns * 2 * latency + t.generation_s
        rows.append(f"{t.name:<36} {t.wall_s:>8.2f} {t.generation_s:>7.2f} "
                    f"{t.generation_s / (t.dialogues * turns) * 1e3:>11.1f} {t.idle:>6.1%} {bound:>8.2f} "
                    f"{t.wall_s / bound:>10.2f} {seq_all.wall_s / t.wall_s:>8.1f} {t.requests:>8} "
                    f"{t.peak_in_flight:>5} {t.compiles:>8}")
    print_table(header, rows, f"\ngen ms/turn: generation time per dialogue turn. idle: 1 - gen / wall. bound: turns "
                f"x 2 x latency + gen = {turns * 2 * latency:.1f} s + gen (the last turn has no reply step: "
                f"{2 * turns - 1} requests per dialogue). peak: simulator requests in flight at once.")
    if seq.dialogues != dialogues:
        print(f"sequential: timed on {seq.dialogues} of {dialogues} dialogues, extrapolated linearly.")
    for t in constant:
        speedup, ratio = seq_all.wall_s / t.wall_s, t.wall_s / (turns * 2 * latency + t.generation_s)
        print(f"{t.name}: speed-up {speedup:.1f}x (target >= 10x: {'PASS' if speedup >= 10 else 'FAIL'}), "
              f"wall/bound {ratio:.2f} (target <= 1.5: {'PASS' if ratio <= 1.5 else 'FAIL'})")


def print_table(header: str, rows: list[str], note: str) -> None:
    """A table: its header, a rule, its rows, then what its columns mean."""
    print(header)
    print("-" * len(header))
    print("\n".join(rows))
    print(note)


def latency_table(ours: dict[str, list[Timing]], dialogues: int) -> None:
    """Every setting against its critical-path bound and against the constant-latency runs of its
    schedule (run by run: the same repeat)."""
    constant = {name.split(", ", 1)[1]: runs for name, runs in ours.items() if name.startswith("constant")}
    print(f"\n{dialogues} dialogues x {_TURNS.value} turns, request latency mean {_LATENCY.value:g} s, max_new_tokens "
          f"{_MAX_NEW_TOKENS.value}, tiny random Qwen2 on {jax.devices()[0].platform}; median [range] of "
          f"{_REPEATS.value} run(s)")
    header = (f"{'run':<44} {'wall s':>22} {'gen s':>7} {'calls':>6} {'call s':>7} {'slowest user s':>14} "
              f"{'bound s':>8} {'wall/bound':>10} {'vs constant':>19} {'compiles':>8}")
    rows = []
    for name, runs in ours.items():
        base = constant.get(name.split(", ", 1)[1])
        versus = _spread([t.wall_s / b.wall_s for t, b in zip(runs, base)]) if base else "-"
        rows.append(f"{name:<44} {_spread([t.wall_s for t in runs]):>22} "
                    f"{_median([t.generation_s for t in runs]):>7.2f} {_median([t.calls for t in runs]):>6.0f} "
                    f"{_median([t.call_s for t in runs]):>7.3f} {_median([t.slowest_user_s for t in runs]):>14.2f} "
                    f"{_median([t.critical_path for t in runs]):>8.2f} "
                    f"{_median([t.wall_s / t.critical_path for t in runs]):>10.2f} {versus:>19} "
                    f"{sum(t.compiles for t in runs):>8}")
    print_table(header, rows, "bound: the slowest dialogue's simulator seconds + turns x a turn's generation (static: "
                "the median call; engine: the median turn, request to reply). vs constant: wall over the "
                "constant-latency run of the same schedule and repeat. compiles: over every run.")


def lengths_table(ours: dict[str, list[Timing]]) -> None:
    """Useful tokens per device-busy second and per wall second, the device's busy share, and each
    reply's wait after its last token (every run's replies); `vs constant`: the busy rate over that
    of the same setting with constant reply lengths in the same repeat (the same tokens in all)."""
    def constant_key(name: str) -> str:
        shape, lengths, schedule = name.split(", ", 2)
        return f"{shape}, constant, {schedule}"

    print(f"\nreplies: budget (to a stop token or max_new_tokens {_MAX_NEW_TOKENS.value}), constant "
          f"({_MAX_NEW_TOKENS.value / 4:g} tokens) or lognormal (mean {_MAX_NEW_TOKENS.value / 4:g}, log-sd "
          f"{_LENGTH_LOG_SD.value:g}); decode_chunk {_DECODE_CHUNK.value}; median [range] of {_REPEATS.value} run(s)")
    header = (f"{'run':<52} {'tokens':>7} {'busy s':>7} {'tok/busy s':>22} {'tok/wall s':>10} {'busy':>6} "
              f"{'wait ms mean':>12} {'p95':>6} {'max':>6} {'vs constant':>19}")
    rows = []
    for name, runs in ours.items():
        rates = [t.tokens / t.generation_s for t in runs]
        base = ours.get(constant_key(name))
        versus = _spread([r / (b.tokens / b.generation_s) for r, b in zip(rates, base)]) if base else "-"
        waits = np.concatenate([t.waits for t in runs]) * 1e3
        rows.append(f"{name:<52} {_median([t.tokens for t in runs]):>7.0f} "
                    f"{_median([t.generation_s for t in runs]):>7.2f} {_spread(rates, 0):>22} "
                    f"{_median([t.tokens / t.wall_s for t in runs]):>10.0f} "
                    f"{_median([1 - t.idle for t in runs]):>6.1%} {waits.mean():>12.1f} "
                    f"{np.percentile(waits, 95):>6.1f} {waits.max():>6.1f} {versus:>19}")
    print_table(header, rows, "wait: from a reply's last token to its return (static: its call's longest row; "
                "engine: the rest of its call), at its call's rate, over every run.")


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    for name in ("httpx", "httpx2"):  # the openai client's HTTP library logs every request at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    groups = [int(g) for g in _GROUPS.value]
    waits = [float(w) for w in _WAITS.value]
    profiles = load_profiles()
    # GRPO-style: each profile's dialogues share a group id.
    requests = [EpisodeRequest(profiles[i % len(profiles)], i % len(profiles), index=i)
                for i in range(_DIALOGUES.value)]
    with tempfile.TemporaryDirectory() as tmp:
        chat_tokens = chat.ChatTokens.from_tokenizer(chat.load_tokenizer(build_tiny_tokenizer(tmp)))
    model_cfg = get_preset("tiny")
    key_params, key_sampling = jax.random.split(jax.random.key(_SEED.value))
    params = qwen2.init_params(model_cfg, key_params)
    engine = EngineSettings(decode_chunk=_DECODE_CHUNK.value, row_slots=row_slots(_MAX_TOTAL))
    sampling = SamplingSettings(max_new_tokens=_MAX_NEW_TOKENS.value, cache_slots=_CACHE_SLOTS.value)
    samplers = {"static": TimedPolicy, "continuous": TimedEngine}  # each engine's class, timed
    policies = {e: samplers[e](model_cfg, chat_tokens, sampling, engine, key_sampling) for e in _ENGINES.value}
    # The reference loop re-encodes each dialogue's history every turn.
    seq_policy = TimedPolicy(model_cfg, chat_tokens, SamplingSettings(max_new_tokens=_MAX_NEW_TOKENS.value),
                             engine, key_sampling)
    for p in [*policies.values(), seq_policy]:
        p.publish(0, params)
    latency = Latency()
    script = route(emotion=lambda r: Reply(_EMOTION_ANSWER, delay_s=latency(r)),
                   reply=lambda r: Reply(_REPLY_ANSWER, delay_s=latency(r)))
    with ScriptedServer(script) as server:
        sim_cfg = get_simulator_config()
        sim_cfg.update(backend="openai", base_url=server.base_url, max_turns=_TURNS.value, max_concurrency=64)
        simulator = TimedSimulator(build_simulator(SimulatorSettings.from_config(sim_cfg)))
        # format_failure=continue: an empty random reply must not end a dialogue early.
        settings = RolloutSettings(think=False, max_new_tokens=_MAX_NEW_TOKENS.value, max_total_tokens=_MAX_TOTAL,
                                   format_failure="continue")
        runners = {e: VariedLengths(p, simulator, chat_tokens, dataclasses.replace(
            settings, continuous=ENGINES[e].continuous)) for e, p in policies.items()}
        seq_runner = EpisodeRunner(seq_policy, simulator, chat_tokens, settings)

        async def run() -> tuple[list[Timing], Timing]:
            try:
                return await benchmark(runners, seq_runner, requests, groups, waits, server, latency)
            finally:
                await simulator.simulator.aclose()

        ours, seq = asyncio.run(run())
    report(ours, seq, len(requests))


if __name__ == "__main__":
    app.run(main)

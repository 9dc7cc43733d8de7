r"""Rollout benchmark (issues 6 and 41): batched, pipelined dialogues vs a sequential per-dialogue loop;
lockstep rounds vs per-dialogue progress under heavy-tailed simulator latency.

  .venv/bin/python benchmarks/rollout.py
  .venv/bin/python benchmarks/rollout.py --sequential_dialogues=0   # time the whole baseline
  .venv/bin/python benchmarks/rollout.py --latency_s=2.5 --latency_log_sd=0,0.75,1.0 \
      --batch_wait_s=inf,0.05,0.25 --pipeline_groups=1 --max_new_tokens=48 --sequential_dialogues=-1   # issue 41

32 dialogues x 8 policy turns of the tiny random Qwen2 (JaxPolicy, think=False) against the scripted
OpenAI-compatible test server (rlver_jax/testing/scripted_server.py) through the real openai
simulator backend; the server sleeps `latency_s` per request. The simulator answers "Change: 0" and
a neutral line without farewells, and format failures (an empty random reply) continue, so every
dialogue runs all turns: the emotion step every turn, the reply step on all but the last.

  ours: EpisodeRunner.run, once per --latency_log_sd, --pipeline_groups and --batch_wait_s value
    (rollout.batch_wait_s: inf is lockstep rounds, a finite wait per-dialogue progress).
  sequential: the reference RLVER loop, for each turn, for each dialogue, a batch-of-one policy
    generation and then that dialogue's blocking simulator calls. It takes dialogues x turns x 2 x
    latency (~150 s) plus generation, so by default it runs on --sequential_dialogues dialogues
    spread over the set and is extrapolated linearly (its cost is a sum of per-dialogue costs).

Latency: each request sleeps a lognormal time of mean --latency_s and log-sd --latency_log_sd (0:
constant), drawn from a hash of the request's messages, so every schedule meets the same latencies.
The critical-path bound of a run is what no schedule on one device can beat by much: the slowest
dialogue's own simulator steps (timed per dialogue) plus its turns' generation, each turn at the
run's median device-call time.

Generation time is the union of the intervals spent in the policy's device calls (concurrent
pipeline groups queue on the policy's device lock, inside the running call's interval). Every
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
from rlver_jax.text import chat  # noqa: E402
from rlver_jax.sampling import generation
from rlver_jax.sampling.buckets import LENGTH_BUCKETS, bucket  # noqa: E402
from rlver_jax.models import qwen2  # noqa: E402
from rlver_jax.models.config import get_preset  # noqa: E402
from rlver_jax.rollout.episodes import EpisodeRequest, EpisodeRunner, RolloutSettings  # noqa: E402
from rlver_jax.rollout.jax_policy import JaxPolicy  # noqa: E402
from rlver_jax.rollout.policy import PolicyTurn, TurnRequest  # noqa: E402
from rlver_jax.rollout.prompts import system_prompt  # noqa: E402
from rlver_jax.rollout.sequence import DialogueSequence  # noqa: E402
from rlver_jax.sampling.settings import SamplingSettings  # noqa: E402
from rlver_jax.simulator import SimulatorSettings, build_simulator  # noqa: E402
from rlver_jax.simulator.profiles import load_profiles  # noqa: E402
from rlver_jax.text.tiny_tokenizer import build_tiny_tokenizer  # noqa: E402
from rlver_jax.simulator.agent import DialogueState  # noqa: E402
from rlver_jax.testing.scripted_server import Reply, ScriptedServer, route  # noqa: E402

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
    "cache_slots", 16384, "Ours: KV-cache slots kept per dialogue between turns (0: re-encode every turn).")

# Scripted simulator answers: no emotion change and no farewell, so no dialogue ends early.
_EMOTION_ANSWER = "Analysis: the reply is neither helpful nor hurtful.\nChange: 0"
_REPLY_ANSWER = "Plan: keep talking.\nResponse: I see. Tell me more about it."
_USER_LINE = "I see. Tell me more about it."


class TimedPolicy(JaxPolicy):
    """JaxPolicy that records the (start, end) of every device call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.intervals: list[tuple[float, float]] = []

    def _generate(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        start = time.perf_counter()
        try:
            return super()._generate(requests)
        finally:
            self.intervals.append((start, time.perf_counter()))

    def busy_seconds(self) -> float:
        """Length of the union of the recorded intervals (calls waiting on the lock overlap)."""
        total, reach = 0.0, -math.inf
        for start, end in sorted(self.intervals):
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total


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

    @property
    def critical_path(self) -> float:
        """The slowest dialogue's own simulator steps plus its turns at the median call time."""
        return self.slowest_user_s + _TURNS.value * self.call_s

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
    states = [await runner.simulator.start(r.profile) for r in requests]
    episodes = [runner._open(r, s) for r, s in zip(requests, states)]
    while live := [e for e in episodes if not e.done]:
        for e in live:
            (turn,) = await runner.policy.act([runner._turn_request(e)])
            reply = runner._record_policy_turn(e, turn)
            if reply is not None:
                runner._record_user_turn(e, await runner.simulator.respond(e.state, reply))
    return [runner._finish(e, 0) for e in episodes]


async def timed(name: str, rollout: Callable[[], Awaitable[list[DialogueSequence]]], policy: TimedPolicy,
                server: ScriptedServer, turns: int, simulator: TimedSimulator) -> Timing:
    """Runs one rollout, checks that every dialogue ran all turns, and times it."""
    policy.intervals.clear()
    simulator.clear()
    server.peak_in_flight = 0
    requests, traces = len(server.requests), generation.trace_count()
    start = time.perf_counter()
    seqs = await rollout()
    wall = time.perf_counter() - start
    short = [s.profile_id for s in seqs if s.end_reason != "turn_limit" or len(s.turn_ends) != turns]
    if short or server.errors:
        raise RuntimeError(f"{name}: dialogues ended early {short} or server errors {server.errors}")
    return Timing(name, len(seqs), wall, policy.busy_seconds(), generation.trace_count() - traces,
                  len(server.requests) - requests, server.peak_in_flight, len(policy.intervals),
                  float(np.median([end - start for start, end in policy.intervals])),
                  max(sum(steps) for steps in simulator.steps))


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


async def precompile(policy: JaxPolicy, batch_sizes: set[int], lengths: Sequence[int], pad_id: int) -> None:
    """Traces the generation program of every (batch, prompt length) bucket the timed runs can hit
    (JaxPolicy pads prompts to buckets.LENGTH_BUCKETS)."""
    for b in sorted({bucket(n, None) for n in batch_sizes}):
        for length in lengths:
            await policy.act([TurnRequest([pad_id] * length, [], policy.settings.max_new_tokens)] * b)


async def benchmark(runner: EpisodeRunner, seq_runner: EpisodeRunner, requests: list[EpisodeRequest],
                    groups: list[int], waits: list[float], server: ScriptedServer, latency: Latency
                    ) -> tuple[list[Timing], Timing | None]:
    policy, chat_tokens, turns = runner.policy, runner.policy.chat, _TURNS.value
    # Spread over the whole list, so that the subset mixes profiles (languages, prompt lengths).
    n_seq = max(0, min(_SEQUENTIAL.value or len(requests), len(requests)))
    seq_requests = [requests[i] for i in np.linspace(0, len(requests) - 1, n_seq).round().astype(int)]
    lengths = length_buckets(chat_tokens, requests, turns, _MAX_NEW_TOKENS.value)
    start = time.perf_counter()
    if _SEQUENTIAL.value >= 0:
        await precompile(seq_runner.policy, {1}, lengths, chat_tokens.im_start)
    # Zero-latency rollouts, one per pipeline setting, compile ours' programs and warm the HTTP
    # client, the simulator path and the host code.
    latency.mean_s = 0.0
    for g in groups:
        runner.settings = dataclasses.replace(runner.settings, pipeline_groups=g)
        await runner.run(requests)
    print(f"warm-up (sequential: prompt lengths {lengths}; ours: a zero-latency rollout per setting): "
          f"{time.perf_counter() - start:.1f} s", flush=True)

    latency.mean_s = _LATENCY.value
    ours = []
    for log_sd in [float(v) for v in _LOG_SD.value]:
        latency.log_sd = log_sd
        shape = f"lognormal {log_sd:g}" if log_sd else "constant"
        for g in groups:
            for wait in waits:
                runner.settings = dataclasses.replace(runner.settings, pipeline_groups=g, batch_wait_s=wait)
                progress = "lockstep" if math.isinf(wait) else f"wait {wait:g} s"
                ours.append(await timed(f"{shape}, groups={g}, {progress}", lambda: runner.run(requests), policy,
                                        server, turns, runner.simulator))
                print(f"  {ours[-1].name}: {ours[-1].wall_s:.2f} s", flush=True)
    if _SEQUENTIAL.value < 0:
        return ours, None
    latency.log_sd = 0.0
    seq = await timed("sequential", lambda: sequential(seq_runner, seq_requests), seq_runner.policy, server,
                      turns, seq_runner.simulator)
    print(f"  sequential ({n_seq} dialogues): {seq.wall_s:.2f} s", flush=True)
    return ours, seq


def report(ours: list[Timing], seq: Timing | None, dialogues: int) -> None:
    latency_table(ours, dialogues)
    if seq is None:
        return
    turns, latency = _TURNS.value, _LATENCY.value
    ours = [t for t in ours if t.name.startswith("constant")]
    seq_all = seq.scaled(dialogues) if seq.dialogues != dialogues else seq
    print(f"\n{dialogues} dialogues x {turns} turns, simulator latency {latency * 1e3:.0f} ms/request, "
          f"max_new_tokens {_MAX_NEW_TOKENS.value}, tiny random Qwen2 on {jax.devices()[0].platform}")
    header = (f"{'run':<36} {'wall s':>8} {'gen s':>7} {'gen ms/turn':>11} {'idle':>6} {'bound s':>8} "
              f"{'wall/bound':>10} {'speed-up':>8} {'requests':>8} {'peak':>5} {'compiles':>8}")
    print(header)
    print("-" * len(header))
    for t in ours + [seq_all]:
        bound = turns * 2 * latency + t.generation_s
        print(f"{t.name:<36} {t.wall_s:>8.2f} {t.generation_s:>7.2f} "
              f"{t.generation_s / (t.dialogues * turns) * 1e3:>11.1f} {t.idle:>6.1%} {bound:>8.2f} "
              f"{t.wall_s / bound:>10.2f} {seq_all.wall_s / t.wall_s:>8.1f} {t.requests:>8} "
              f"{t.peak_in_flight:>5} {t.compiles:>8}")
    print(f"\ngen ms/turn: generation time per dialogue turn. idle: 1 - gen / wall. bound: turns x 2 x "
          f"latency + gen = {turns * 2 * latency:.1f} s + gen (the last turn has no reply step: "
          f"{2 * turns - 1} requests per dialogue). peak: simulator requests in flight at once.")
    if seq.dialogues != dialogues:
        print(f"sequential: timed on {seq.dialogues} of {dialogues} dialogues, extrapolated linearly.")
    for t in ours:
        speedup, ratio = seq_all.wall_s / t.wall_s, t.wall_s / (turns * 2 * latency + t.generation_s)
        print(f"{t.name}: speed-up {speedup:.1f}x (target >= 10x: {'PASS' if speedup >= 10 else 'FAIL'}), "
              f"wall/bound {ratio:.2f} (target <= 1.5: {'PASS' if ratio <= 1.5 else 'FAIL'})")


def latency_table(ours: list[Timing], dialogues: int) -> None:
    """Every run against its critical-path bound and against the constant-latency run of its schedule."""
    constant = {t.name.split(", ", 1)[1]: t.wall_s for t in ours if t.name.startswith("constant")}
    print(f"\n{dialogues} dialogues x {_TURNS.value} turns, request latency mean {_LATENCY.value:g} s, max_new_tokens "
          f"{_MAX_NEW_TOKENS.value}, tiny random Qwen2 on {jax.devices()[0].platform}")
    header = (f"{'run':<44} {'wall s':>8} {'gen s':>7} {'calls':>6} {'call s':>7} {'slowest user s':>14} "
              f"{'bound s':>8} {'wall/bound':>10} {'vs constant':>11} {'compiles':>8}")
    print(header)
    print("-" * len(header))
    for t in ours:
        base = constant.get(t.name.split(", ", 1)[1])
        print(f"{t.name:<44} {t.wall_s:>8.2f} {t.generation_s:>7.2f} {t.calls:>6} {t.call_s:>7.3f} "
              f"{t.slowest_user_s:>14.2f} {t.critical_path:>8.2f} {t.wall_s / t.critical_path:>10.2f} "
              f"{t.wall_s / base if base else math.nan:>11.2f} {t.compiles:>8}")
    print("bound: the slowest dialogue's simulator seconds + turns x the median call. vs constant: wall over "
          "the constant-latency run of the same schedule.")


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
    policy = TimedPolicy(model_cfg, chat_tokens, SamplingSettings(
        max_new_tokens=_MAX_NEW_TOKENS.value, cache_slots=_CACHE_SLOTS.value), params, key_sampling)
    # The reference loop re-encodes each dialogue's history every turn.
    seq_policy = TimedPolicy(model_cfg, chat_tokens, SamplingSettings(max_new_tokens=_MAX_NEW_TOKENS.value),
                             params, key_sampling)
    latency = Latency()
    script = route(emotion=lambda r: Reply(_EMOTION_ANSWER, delay_s=latency(r)),
                   reply=lambda r: Reply(_REPLY_ANSWER, delay_s=latency(r)))
    with ScriptedServer(script) as server:
        sim_cfg = get_simulator_config()
        sim_cfg.update(backend="openai", base_url=server.base_url, max_turns=_TURNS.value, max_concurrency=64)
        simulator = TimedSimulator(build_simulator(SimulatorSettings.from_config(sim_cfg)))
        # format_failure=continue: an empty random reply must not end a dialogue early.
        settings = RolloutSettings(think=False, max_new_tokens=_MAX_NEW_TOKENS.value, max_total_tokens=8192,
                                   format_failure="continue")
        runner = EpisodeRunner(policy, simulator, chat_tokens, settings)
        seq_runner = EpisodeRunner(seq_policy, simulator, chat_tokens, settings)

        async def run() -> tuple[list[Timing], Timing]:
            try:
                return await benchmark(runner, seq_runner, requests, groups, waits, server, latency)
            finally:
                await simulator.simulator.aclose()

        ours, seq = asyncio.run(run())
    report(ours, seq, len(requests))


if __name__ == "__main__":
    app.run(main)

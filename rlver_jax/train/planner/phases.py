"""The programs a training run executes, each compiled from abstract shapes (every input a
`jax.ShapeDtypeStruct` carrying the run's sharding) into a `Phase` (train.planner.compiled): its
per-device memory and, compiled for a target's chip or card, its cost
(rlver_jax.train.planner.hlo_cost). The phases:

  prepare        the train step's first program (`update.prepare_step`): old (and reference)
                 log-probs, values, advantages; it reads the models, not their AdamW states.
  actor update   the actor's program (`update.model_epochs`): epochs x mini-batches of actor
                 updates with micro-batch accumulation, its params and AdamW state donated.
  critic update  the same for the critic (PPO). config.train.offload says which of the state's
                 parts wait in host memory in each (rlver_jax.rl.offload).
                 A run's update phase is these three programs, one after another: its peak is theirs.
  rollout        the rollout engine's programs, as the plan its row names says
                 (train.planner.sampler: continuous_plan.py, static_plan.py; none for an engine
                 that samples off the trainer's devices).
  evaluation     the in-loop evaluation's (config.train.eval_policy) on the same engine, one
                 host's share of the held-out profiles.

Compiled for a TPU topology, every figure is the TPU compiler's: the memory of each program, the
offload's transfers (`transfer_plan`: programs between HBM and pinned host memory, memory kinds as
the TPU compiler takes them), and each program's cost for the roofline; for a GPU target the CUDA
compiler's, the offload's moves by the shard arithmetic (`transfer_plan`).

A phase's per-device total = resident + arguments + temporaries + outputs not aliased to donated
arguments; `resident` is what stays on the device through the phase without being an argument of
its program: the rest of the train state on the devices (not what config.train.offload puts in
host memory: `setup.resident`), the placed batch during the updates and, with the static engine's
KV cache on, the caches of the other pipeline groups.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import jax

from rlver_jax.parallel import sharding
from rlver_jax.rl import offload
from rlver_jax.train.planner.compiled import Phase, compile_program, program_phase
from rlver_jax.train.planner.sampler import eval_profiles, rollout_shapes
from rlver_jax.train.planner.setup import PHASES, Setup, resident


@dataclasses.dataclass(frozen=True)
class Transfer:
    """The offload's moves into one stage (rl.offload.place), compiled: per device, bytes the
    programs write to host memory and to the devices, and the moves' temporaries."""

    stage: str  # the stage the state arrives at (offload.STAGES)
    to_host: int
    to_device: int
    temporaries: int
    seconds: float


def prepare_phase(s: Setup) -> Phase:
    compiled, secs = compile_program(s, s.update.prepare, s.models, s.frozen, s.batch)
    return program_phase(s, "prepare", compiled, resident(s, "prepare"), secs, "old/ref log-probs, values, advantages")


def model_update_phase(s: Setup, name: str) -> Phase:
    """The `actor update` or `critic update` program: every mini-batch of the step, its model's
    params and AdamW state donated. Resident: the run key, the reference, the placed batch and
    what config.train.offload leaves on the devices of the rest of the state."""
    model = name.split()[0]
    fn = dict(s.update.model_programs())[model]
    compiled, secs = compile_program(s, fn, s.state.step, *s.state.model(model), s.base, s.inputs, s.rows)
    note = f"{s.rows.shape[0]} mini-batch(es)"
    if s.in_host_memory(model):
        note += f"; in host memory: {', '.join(s.in_host_memory(model))}"
    return program_phase(s, name, compiled, resident(s, name), secs, note)


def transfer_plan(s: Setup) -> tuple[list[Transfer], tuple[int, int]] | None:
    """The offload's moves of a train step (rl.offload.place from stage to stage, rest back to rest)
    compiled as programs whose outputs carry memory kinds, as the TPU compiler takes them: each
    stage's parts leaving the devices (outputs in pinned host memory), then those arriving. Per
    device, from the compiler's memory analysis: what each stage writes to host memory and to the
    devices, and the moves' own temporaries; and (device, host) bytes of the state between steps.
    None off TPU (XLA:CPU has no host memory space, and jax lowers a `pinned_host` output for the
    CUDA compiler's compile-only devices, which have no memories, as a device one: crossing_bytes
    counts the shards instead) or without offload."""
    if s.offload == "none" or s.platform != "tpu":
        return None
    present = tuple(p for p in offload.PARTS if getattr(s.state, p) is not None)
    stages = ["rest", "prepare", "actor"] + (["critic"] if s.state.critic is not None else []) + ["rest"]

    def compiled(parts: list[str], to_host: bool):
        trees = [getattr(s.state, p) for p in parts]
        shardings = [jax.tree.map(lambda x: x.sharding, t) for t in trees]
        source = offload.in_host_kind(shardings) if not to_host else shardings
        dest = offload.in_host_kind(shardings) if to_host else shardings
        args = sharding.with_shardings(trees, source)
        t0 = time.perf_counter()
        out = jax.jit(lambda x: x, out_shardings=dest).lower(args).compile()
        return out.memory_analysis(), time.perf_counter() - t0

    transfers = []
    for before, after in zip(stages, stages[1:]):
        out, into = offload.moves(s.offload, before, after, present)
        to_host = to_device = temps = 0
        secs = 0.0
        if out:
            mem, t = compiled(out, True)
            to_host, temps, secs = mem.host_output_size_in_bytes, max(temps, mem.temp_size_in_bytes), secs + t
        if into:
            mem, t = compiled(into, False)
            to_device, temps, secs = mem.output_size_in_bytes, max(temps, mem.temp_size_in_bytes), secs + t
        transfers.append(Transfer(after, to_host, to_device, temps, secs))
    # The state between steps: each part in its memory at rest.
    on = offload.OFFLOAD[s.offload]["rest"]
    shardings = jax.tree.map(lambda x: x.sharding, s.state)
    rest = s.state.replace(**{p: sharding.with_shardings(getattr(s.state, p), offload.in_host_kind(
        getattr(shardings, p))) for p in present if p not in on})
    mem = jax.jit(lambda x: x).lower(rest).compile().memory_analysis()
    return transfers, (mem.argument_size_in_bytes, mem.host_argument_size_in_bytes)


# ----------------------------------------------------------------------------- the phases by name


def run_phases(s: Setup, phases: Sequence[str], feed_tokens: int) -> list[Phase]:
    out = []
    for name in phases:
        if name == "critic update" and not s.rl.uses_critic:
            continue
        if name == "prepare":
            out.append(prepare_phase(s))
        elif name in ("actor update", "critic update"):
            out.append(model_update_phase(s, name))
        elif name == "rollout":
            out += rollout_shapes(s.spec, feed_tokens, s.hosts).phases(s, s.host_devices)
        elif name == "evaluation":
            if eval_profiles(s.spec):
                out += rollout_shapes(s.spec, feed_tokens, s.hosts, evaluation=True).phases(s, s.host_devices)
        else:
            raise ValueError(f"unknown phase {name!r}; use some of {PHASES}")
    return out

"""The memory plan of a training run (launch/plan.py): its programs compiled ahead of time from
abstract shapes, without allocating a weight, and where one does not fit, the largest shapes that do.

The planner takes a training config's spec (the same file and overrides as launch/train.py) and
builds the abstract run that `build_run` loads weights into (rlver_jax.train.abstract_run), so the
programs it compiles are the ones training runs (tests/plan_test.py checks that both lower to one
program each): rlver_jax.train.planner.phases says which.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from rlver_jax.parallel import chips, topology
from rlver_jax.train.planner import cases as cases_lib
from rlver_jax.train.planner.compiled import Phase
from rlver_jax.train.planner.estimate import Case, StepEstimate
from rlver_jax.train.planner.lengths import Lengths
from rlver_jax.train.planner.phases import Transfer, run_phases, transfer_plan
from rlver_jax.train.planner.sampler import eval_profiles, rollout_shapes
from rlver_jax.train.planner.search import fitting_shapes
from rlver_jax.train.planner.setup import GB, PHASES, SAMPLERS, UPDATE, Setup, abstract_setup, device_bytes
from rlver_jax.train.spec import RunSpec


@dataclasses.dataclass(frozen=True)
class Plan:
    """The compiled phases of a run against a per-device budget, and what the plan found besides."""

    setup: Setup
    phases: list[Phase]
    memory_gb: float
    sizes: dict[str, int]  # per-device bytes of the state's parts and the batch
    rollout: str  # the rollout phase's shapes, in words
    suggestions: list[str] = dataclasses.field(default_factory=list)  # the largest shapes that fit
    transfers: list[Transfer] | None = None  # the offload's moves as compiled (TPU), else None
    at_rest: tuple[int, int] | None = None  # (device, host) bytes of the state between steps, compiled
    evaluation: str = ""  # the evaluation phase's shapes, in words ("": none)
    lengths: Lengths = Lengths()  # the step estimate's length assumptions (its feed: a turn's tokens into a KV row)
    estimate: StepEstimate | None = None  # the step estimate (a chip's figures: a target's, or this host's measured)
    cases: list[Case] = dataclasses.field(default_factory=list)  # the estimate's dialogues and update shapes

    @property
    def feed_tokens(self) -> int:
        return self.lengths.feed

    @property
    def peak(self) -> Phase:
        """The phase of most bytes per device (none compiled: an engine that samples off the devices)."""
        return max(self.phases, key=lambda p: p.total, default=Phase("no program", 0, 0, 0, 0, 0.0))

    @property
    def fits(self) -> bool:
        return self.peak.total <= self.memory_gb * GB


def _kind(name: str) -> str:
    """The phase of PHASES a compiled program belongs to ("rollout compact" -> "rollout")."""
    return name if name in PHASES else name.split()[0]


def plan(spec: RunSpec, memory_gb: float | None = 16.0, phases: Sequence[str] = PHASES,
         lengths: Lengths = Lengths(), search: bool = True, log: Callable[[str], None] = lambda _: None,
         hoist_converts: bool = True, host_devices: int | None = None,
         target: topology.Target | None = None, host_chip: chips.Chip | None = None, estimate: bool = True) -> Plan:
    """Compile the phases of `spec`'s run and, with `search`, find the largest shapes that fit
    wherever the update (any of its programs), the rollout or the evaluation does not. `target`:
    compile for a TPU topology's or GPU target's devices (rlver_jax.parallel.topology,
    gpu_topology) instead of this host's; `memory_gb` None: the target's memory per device (16 on
    this host's). With a chip's figures (a target's, or `host_chip`: this host's CPU measured,
    rlver_jax.parallel.host_peaks) and `estimate` the plan estimates a step (planner.cases) under
    `lengths`."""
    feed_tokens = lengths.feed
    s = abstract_setup(spec, hoist_converts, host_devices, target, host_chip=host_chip)
    if memory_gb is None:
        memory_gb = s.chip.hbm_gb if s.chip is not None else 16.0
    trained = "adapters" if s.update.lora.enabled else "params"  # LoRA: a critic's value head among them
    sizes = {f"actor {trained}": device_bytes(s.state.actor), "actor AdamW state": device_bytes(s.state.actor_opt)}
    if s.state.critic is not None:
        sizes.update({f"critic {trained}": device_bytes(s.state.critic),
                      "critic AdamW state": device_bytes(s.state.critic_opt)})
    if s.ref is not None:
        sizes["frozen base" if s.update.lora.enabled else "reference params"] = device_bytes(s.ref)
    sizes["train batch"] = device_bytes(s.batch)
    done = []
    for name in (n for n in phases if n != "critic update" or s.rl.uses_critic):  # GRPO: no critic to compile
        log(f"compiling {name} ...")
        for p in run_phases(s, [name], feed_tokens):
            done.append(p)
            log(f"  {p.name}: resident {p.resident / GB:.3f} + arguments {p.arguments / GB:.3f} + temporaries "
                f"{p.temporaries / GB:.3f} + outputs {p.outputs / GB:.3f} = {p.total / GB:.3f} GB/device, "
                f"compiled in {p.seconds:.1f} s")
    evaluation = ""
    if "evaluation" in phases:
        n = eval_profiles(spec)
        evaluation = ("off (config.train.eval_every=0 or no held-out profiles)" if n == 0 else
                      f"profiles unknown ({spec.data.eval_profiles} not here): set config.train.eval_max_profiles"
                      if n is None else rollout_shapes(spec, feed_tokens, s.hosts, evaluation=True).describe()
                      + f"; {n} held-out profiles")
    moved = transfer_plan(s)
    step, cases = cases_lib.build(s, done, lengths, log) if estimate else (None, [])
    result = Plan(s, done, memory_gb, sizes, rollout_shapes(spec, feed_tokens, s.hosts).describe(),
                  transfers=moved and moved[0], at_rest=moved and moved[1], evaluation=evaluation,
                  lengths=lengths, estimate=step, cases=cases)
    if search:
        over = [p.name for p in done if p.total > memory_gb * GB]
        for label, names in (("update", [n for n in over if n in UPDATE]),
                             *((k, sorted({_kind(n) for n in over if _kind(n) == k})) for k in SAMPLERS)):
            if names:
                log(f"{', '.join(names)} does not fit: searching")
                found = fitting_shapes(spec, memory_gb * GB, names, feed_tokens, log, hoist_converts, host_devices,
                                       target)
                result.suggestions.append(f"{label}: {' '.join(found)}")
    return result

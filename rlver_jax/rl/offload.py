"""What of the train state waits in host memory (config.train.offload), and moving it there and back.

Per mode, the table (rlver_jax.rl.offload_modes.OFFLOAD, no JAX) names the state's parts on the
devices at each stage of a step; the others are in host memory. The planner
(rlver_jax.train.planner) reads the same table, through this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax

# READS and STAGES: the planner reads them here
from rlver_jax.rl.offload_modes import OFFLOAD, PARTS, moves_nothing
from rlver_jax.rl.offload_modes import READS as READS
from rlver_jax.rl.offload_modes import STAGES as STAGES

if TYPE_CHECKING:
    from rlver_jax.rl.train_state import TrainState

HOST_MEMORY = "pinned_host"


def check_mode(mode: str, mesh: Any) -> None:
    """One clear error for an offload mode the run cannot use: unknown, without a mesh (no
    shardings to move between), or on devices without host memory."""
    if moves_nothing(mode):  # (an unknown mode: one error naming the field)
        return
    if mesh is None:
        raise ValueError(f"config.train.offload={mode!r} needs the run's mesh (the state's shardings)")
    kinds = {m.kind for m in mesh.devices.flat[0].addressable_memories()}
    # A GPU target's compile-only devices (the planner's, rlver_jax.parallel.gpu_topology) report no
    # memories at all, where the GPUs they describe have pinned host memory: the run on them checks.
    if kinds and HOST_MEMORY not in kinds:
        raise ValueError(f"config.train.offload={mode!r} needs {HOST_MEMORY!r} memory; the "
                         f"{mesh.devices.flat[0].platform} devices have {sorted(kinds)}: use offload='none'")


def in_host_memory(mode: str, stage: str, parts: tuple[str, ...] = PARTS) -> list[str]:
    """Those of `parts` that offload `mode` keeps in host memory at `stage` (one of STAGES)."""
    return [p for p in parts if p not in OFFLOAD[mode][stage]]


def in_host_kind(shardings: Any) -> Any:
    """The same shardings in host memory (HOST_MEMORY): where offloaded parts wait. On TPU the
    compiler takes memory kinds as they are: a program whose outputs carry them is a transfer
    between HBM and the host's pinned memory (the planner compiles place's moves so)."""
    return jax.tree.map(lambda sh: sh.with_memory_kind(HOST_MEMORY), shardings)


def moves(mode: str, before: str, after: str, parts: tuple[str, ...] = PARTS) -> tuple[list[str], list[str]]:
    """(parts going to host memory, parts coming to the devices) between stages `before` and
    `after` under offload `mode`, in `place`'s order: the parts leaving first."""
    on_before, on_after = OFFLOAD[mode][before], OFFLOAD[mode][after]
    out = [p for p in parts if p in on_before and p not in on_after]
    into = [p for p in parts if p not in on_before and p in on_after]
    return out, into


def place(state: TrainState, stage: str, mode: str, shardings: TrainState | None) -> TrainState:
    """`state` with its parts where offload `mode` has them at `stage` (`shardings`: the state's
    in device memory): parts leaving the devices go first, so the memory is free before the others
    arrive. Moving frees the source buffers (device_put cannot donate across memory kinds), so
    `state` is consumed."""
    if moves_nothing(mode):
        return state
    wanted = OFFLOAD[mode][stage]

    def kind(part: str) -> str:
        return jax.tree.leaves(getattr(state, part))[0].sharding.memory_kind

    parts = [p for p in PARTS if getattr(state, p) is not None]
    out = [p for p in parts if p not in wanted and kind(p) != HOST_MEMORY]
    into = [p for p in parts if p in wanted and kind(p) == HOST_MEMORY]
    for moving, to_host in ((out, True), (into, False)):
        if moving:
            trees = [getattr(state, p) for p in moving]
            targets = [getattr(shardings, p) for p in moving]
            if to_host:
                targets = in_host_kind(targets)
            moved = jax.block_until_ready(jax.device_put(trees, targets))
            for x in jax.tree.leaves(trees):
                x.delete()
            state = state.replace(**dict(zip(moving, moved)))
    return state

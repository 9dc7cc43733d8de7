"""The mesh's shape against the devices a run has: `resolve_mesh_shape`, without JAX, so a launch
script checks config.mesh.shape before it imports JAX wherever the device count is known then
(rlver_jax/cli/program.check_mesh), and again once JAX has found the devices."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlver_jax.checks import InputError

MESH_AXES = ("data", "fsdp", "tensor")

# Where a mesh does not fit this host's devices because the host is not the target (a CPU planning a
# 16-device run): the fix is the device count, not the mesh.
_DEVICE_HINT = ("; to plan for other hardware on a CPU, fake its device count: XLA_FLAGS="
                "--xla_force_host_platform_device_count=N before the command (or launch/plan.py --topology=v5e:4x4 "
                "for a TPU slice)")


def resolve_mesh_shape(shape: Sequence[int], device_count: int,
                       devices: str = "jax.device_count()") -> tuple[int, int, int]:
    """`mesh.shape` (data, fsdp, tensor) with at most one -1 replaced by the remaining devices of
    `device_count` (`devices`: where that count comes from, for the message). An InputError names
    config.mesh.shape and the fix when it cannot cover them."""
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        shape = ()
    if len(shape) != len(MESH_AXES):
        raise InputError(f"config.mesh.shape={tuple(shape)} must be {len(MESH_AXES)} integers {MESH_AXES}, "
                         "e.g. --config.mesh.shape='(1,-1,1)'")
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise InputError(f"config.mesh.shape={shape}: use positive sizes and at most one -1 (the rest of the "
                         "devices)")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if device_count % known:
            raise InputError(
                f"config.mesh.shape={shape}: the fixed axes multiply to {known}, which does not divide the "
                f"{device_count} devices this run has ({devices}); change config.mesh.shape{_DEVICE_HINT}")
        shape = tuple(device_count // known if s == -1 else s for s in shape)
    if math.prod(shape) != device_count:
        raise InputError(
            f"config.mesh.shape={shape} multiplies to {math.prod(shape)} devices but this run has {device_count} "
            f"({devices}); "
            f"set config.mesh.shape so the product is {device_count} (or put -1 on one axis){_DEVICE_HINT}")
    return shape

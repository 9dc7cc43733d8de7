"""A run's devices in two groups (config.mesh.sampler_devices): the trainer's, over which the
training mesh is built, and the sampler's, which hold each process's sampling copy of the policy
(parallel.sampling_copy.SamplingLayout) and run the rollout engine. With rollout.max_staleness >= 1
the next batch's rollout then runs on the sampler's devices while the update runs on the
trainer's, the weights published across (SamplingLayout.copy) at the staleness the rollout buffer
allows; without the split both share every device, and only the host's work (the simulator's
latency, the scheduling) overlaps the update.

Each process gives its last `sampler_devices` local devices (by id) to the sampler, so every
process still samples its own dialogues on devices of its own, as without the split.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from rlver_jax.checks import InputError


def split_devices(devices: Sequence[jax.Device], sampler_devices: int) -> tuple[list[jax.Device], list[jax.Device]]:
    """(the trainer's devices, the sampler's) of `devices`: each process's last `sampler_devices`
    devices sample; 0: every device trains, and the sampler's group is empty (it shares them)."""
    if not sampler_devices:
        return list(devices), []
    by_process: dict[int, list[jax.Device]] = {}
    for d in sorted(devices, key=lambda d: d.id):
        by_process.setdefault(d.process_index, []).append(d)
    fewest = min(len(v) for v in by_process.values())
    if sampler_devices >= fewest:
        raise InputError(f"config.mesh.sampler_devices={sampler_devices} leaves no device to train on: each process "
                         f"has {fewest}; set it below {fewest} (0: train and sample on every device)")
    trainer = [d for p in sorted(by_process) for d in by_process[p][:-sampler_devices]]
    sampler = [d for p in sorted(by_process) for d in by_process[p][-sampler_devices:]]
    return trainer, sampler

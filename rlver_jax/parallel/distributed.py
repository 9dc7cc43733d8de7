"""Whether a process is one of a multi-process JAX run (`DistributedSettings`, the
`mesh.distributed` section), decided without importing JAX: launch/eval.py of served models
asks it and imports JAX only when the answer is yes. sharding.maybe_initialize_distributed starts
the run.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from rlver_jax.parallel.peers import runtime_heartbeat_s

_MULTIHOST_ENV = "RLVER_MULTIHOST"  # exported by launch/tpu_pod.sh on every pod worker


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """The `mesh.distributed` section (configs/mesh.py) as a typed record.

    initialize: 'never'; 'always' (Cloud TPU pods: fields left empty, JAX finds the workers);
    'auto' (default): start when a coordinator address or num_processes > 1 is set here or in
    JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES, or when RLVER_MULTIHOST=1 (launch/tpu_pod.sh).
    Empty fields are read from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID, and
    otherwise left to JAX's cluster detection (TPU, SLURM, Open MPI).
    """

    initialize: str = "auto"
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    peer_timeout_s: float = 60.0  # a process silent this long is lost (parallel/peers.py)

    def __post_init__(self):
        if self.initialize not in ("auto", "always", "never"):
            raise ValueError(f"mesh.distributed.initialize={self.initialize!r}; use 'auto', 'always' or 'never'")
        if not self.peer_timeout_s > 0:
            raise ValueError(f"mesh.distributed.peer_timeout_s={self.peer_timeout_s} must be > 0")

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> DistributedSettings:
        return cls(**{f.name: section[f.name] for f in dataclasses.fields(cls)})

    def initialize_arguments(self) -> dict[str, Any] | None:
        """The arguments of jax.distributed.initialize when these settings or the environment ask
        for a multi-process run; None when this process runs alone (then nothing needs JAX)."""
        if self.initialize == "never":
            return None
        address = self.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
        num_processes = self.num_processes if self.num_processes is not None else _env_int("JAX_NUM_PROCESSES")
        process_id = self.process_id if self.process_id is not None else _env_int("JAX_PROCESS_ID")
        if self.initialize == "auto" and not (
                address or (num_processes or 1) > 1 or os.environ.get(_MULTIHOST_ENV) == "1"):
            return None
        return dict(coordinator_address=address, num_processes=num_processes, process_id=process_id,
                    heartbeat_timeout_seconds=runtime_heartbeat_s(self.peer_timeout_s))

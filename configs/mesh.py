"""The `mesh` section shared by every config: device mesh shape, sharding rules, multi-host set-up.

Used as `config.mesh = mesh.get_mesh_config()` and read by `rlver_jax.parallel.sharding`:
`make_mesh(config.mesh.shape)`, `param_shardings(model, mesh, config.mesh.rules)`,
`maybe_initialize_distributed(config.mesh.distributed)`. Overrides from the command line:
`--config.mesh.shape='(1,4,4)' --config.mesh.rules=fsdp`.
"""

from typing import Any, Sequence

import ml_collections
from ml_collections import config_dict


def get_mesh_config(
    shape: Sequence[int] = (1, -1, 1), rules: str | Sequence[Any] = "fsdp_tensor"
) -> ml_collections.ConfigDict:
    """shape: (data, fsdp, tensor) device counts, one of them may be -1 (the remaining devices).
    rules: a preset of `sharding.RULE_PRESETS` ('fsdp', 'tensor', 'fsdp_tensor'), or an explicit
    list of (logical_name, mesh_axis | None | tuple of mesh axes) pairs (set in a config file).
    """
    cfg = ml_collections.ConfigDict()
    cfg.shape = tuple(shape)
    cfg.rules = rules if isinstance(rules, str) else [tuple(r) for r in rules]
    # devices of each process set aside for sampling while the others train (docs/sharding.md, the
    # mesh); 0: every device trains and samples
    cfg.sampler_devices = 0
    cfg.distributed = ml_collections.ConfigDict({
        # 'auto': start when an address / process count is set here or in the environment, or
        # under launch/tpu_pod.sh; 'always': also with empty fields (Cloud TPU pods detect them)
        "initialize": "auto",
        # GPU clusters: host:port of process 0 (else JAX_COORDINATOR_ADDRESS), the process count
        # (else JAX_NUM_PROCESSES) and this process's id (else JAX_PROCESS_ID)
        "coordinator_address": config_dict.placeholder(str),
        "num_processes": config_dict.placeholder(int),
        "process_id": config_dict.placeholder(int),
        # seconds without a heartbeat after which a process counts as lost and every survivor stops
        # with exit status 75, "restart the job" (docs/faults.md)
        "peer_timeout_s": 60.0,
    })
    return cfg

"""Ahead-of-time memory plan of a training step: `launch/plan.py --config=configs/plan.py:PRESET`.

PRESET is one of tiny, 0.5b, 7b (default 7b: PPO actor + critic, one 2048-token sequence per
batch shard, on 16 devices as (1, 4, 4); docs/sharding.md has the results), e.g.
  XLA_FLAGS=--xla_force_host_platform_device_count=16 JAX_PLATFORMS=cpu \\
    python launch/plan.py --config=configs/plan.py:7b
  python launch/plan.py --config=configs/plan.py:tiny   # one CPU device is enough
"""

import ml_collections

from configs import mesh

# preset -> (model preset, mesh shape, rules, global batch, sequence length); the batch is one
# micro-batch: one sequence per batch shard (data x fsdp) on the intended device count.
_PRESETS = {
    "tiny": ("tiny", (1, -1, 1), "fsdp", 8, 128),  # any device count that divides 8, one CPU included
    "0.5b": ("qwen2.5-0.5b", (1, -1, 1), "fsdp", 16, 4096),
    "7b": ("qwen2.5-7b", (1, -1, 4), "fsdp_tensor", 4, 2048),
}


def get_config(preset: str = "7b") -> ml_collections.ConfigDict:
    if preset not in _PRESETS:
        raise ValueError(f"configs/plan.py:{preset}: unknown preset; use one of {sorted(_PRESETS)}")
    model, shape, rules, batch, seq = _PRESETS[preset]
    cfg = ml_collections.ConfigDict()
    cfg.model = ml_collections.ConfigDict(dict(
        preset=model,
        param_dtype="float32",  # fp32 master weights (AdamW moments follow the parameter dtype)
        dtype="bfloat16",  # matmul compute dtype
        scan_layers=True,  # one compiled layer, whatever the depth
        remat="full",  # keep only each layer's input for the backward pass
    ))
    cfg.mesh = mesh.get_mesh_config(shape, rules)
    cfg.batch_size = batch  # global sequences per step
    cfg.seq_len = seq
    cfg.with_critic = True  # PPO: actor and critic, each with its AdamW state
    cfg.memory_budget_gb = 16.0  # per device; the plan reports whether the step fits
    return cfg

"""The plan as text (what launch/plan.py prints): the run, its mesh and shapes, each phase's
per-device memory, the offload, the peak against the budget, the shapes that fit, and the roofline.
"""

from __future__ import annotations

import math

from rlver_jax.models import attention
from rlver_jax.parallel import sharding
from rlver_jax.rl import offload
from rlver_jax.train.planner.plan import Plan
from rlver_jax.train.planner.roofline import format_roofline
from rlver_jax.train.planner.sampler import sampling_layout
from rlver_jax.train.planner.setup import GB, UPDATE, crossing_bytes, resident


def format_plan(plan: Plan, label: str = "") -> str:
    """The plan as text (`label`: the config it is of, else the model preset), as launch/plan.py prints it."""
    s = plan.setup
    p, rl, mesh = s.update, s.rl, s.mesh
    actor = p.actor_cfg
    shards = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
    impl = attention.resolve(actor.attention, s.seq_len, actor.jnp_dtype, s.platform)
    where = "here" if s.target is None else f"on {s.target.device_kind}"
    models = f"actor {actor.num_params() / 1e6:,.1f}M"
    if p.critic_cfg is not None:
        models += f" + critic {p.critic_cfg.num_params() / 1e6:,.1f}M (no LM head)"
    if p.lora.enabled:
        lora = p.lora
        models += (f"; LoRA rank {lora.rank} (alpha {lora.alpha:g}) on {','.join(lora.targets)} of one frozen base in "
                   f"{lora.base_dtype}, also the reference")
    elif s.ref is not None:
        models += " + reference"
    b, t = s.batch["tokens"].shape
    unit, scale = ("GB", GB) if plan.peak.total >= GB else ("MB", 1e6)
    width = max([15] + [len(ph.name) + 1 for ph in plan.phases])
    lines = [
        f"plan       {label or s.spec.model.preset}: {rl.algo}, {models} parameters; "
        f"param_dtype={actor.param_dtype} dtype={actor.dtype} remat={actor.remat} scan_layers={actor.scan_layers} "
        f"attention={actor.attention} ({impl} {where})",
        *([f"target     {s.target.describe()}; compiled by {s.target.compiler}, compile-only devices on this host"]
          if s.target is not None else []),
        f"mesh       {dict(mesh.shape)} = {mesh.size} {mesh.devices.flat[0].platform} devices; "
        f"rules={s.spec.mesh.rules}",
        f"update     {b} rows x {t} tokens (the memory plan: every dialogue every turn, each row at max_total_tokens), "
        f"every token scored; {s.shapes.optimizer_steps} optimizer step(s) per model ({rl.ppo_epochs} epoch(s) x "
        f"mini-batches of {rl.mini_batch_size} {'dialogues' if rl.batch_size else 'rows'}), each "
        f"{s.shapes.micro_batches} micro-batch(es) of {rl.micro_batch_size} rows ({rl.micro_batch_size / shards:g} "
        f"per batch shard); log-prob chunk {rl.logprob_chunk}",
        *([f"update     a step's rows: {c.shapes.describe(s.spec.rollout.drop_thoughts)} ({c.name})"
           for c in plan.cases]),
        *([f"note       micro-batch {rl.micro_batch_size} does not split over the {shards} batch shards: XLA "
           f"spreads its rows as it can "
           f"(try --config.rl.micro_batch_size={shards * max(1, rl.micro_batch_size // shards)})"]
          if rl.micro_batch_size % shards else []),
        f"rollout    {plan.rollout}; the host-local sampling layout "
        f"{dict(sampling_layout(s, s.host_devices).local.shape)}",
        *([f"evaluation {plan.evaluation}"] if plan.evaluation else []),
        *([f"compiler   {s.compiler_options} (XLA:CPU's fp32 copies of bf16 saved activations left out)"]
          if s.compiler_options else []),
        f"state per device ({unit}): " + ", ".join(f"{k} {v / scale:.3f}" for k, v in plan.sizes.items()),
        f"per device ({unit}){' ' * (width - 13)}{'resident':>9} {'arguments':>9} {'temps':>9} {'outputs':>9} "
        f"{'total':>9} {'compile':>8}",
    ]
    for ph in plan.phases:
        lines.append(f"  {ph.name:<{width}}{ph.resident / scale:9.3f} {ph.arguments / scale:9.3f} "
                     f"{ph.temporaries / scale:9.3f} {ph.outputs / scale:9.3f} {ph.total / scale:9.3f} "
                     f"{ph.seconds:7.1f}s  {ph.note}")
    lines += _offload_lines(plan, unit, scale)
    update = [ph for ph in plan.phases if ph.name in UPDATE]
    if update:
        top = max(update, key=lambda ph: ph.total)
        lines.append(f"update     peak {top.total / scale:.3f} {unit} ({top.name}): "
                     f"{'fits' if top.total <= plan.memory_gb * GB else 'does NOT fit'} in {plan.memory_gb:g} GB")
    peak = plan.peak
    verdict = "fits" if plan.fits else "does NOT fit"
    lines.append(f"peak       {peak.total / scale:.3f} {unit} ({peak.name}): {verdict} in {plan.memory_gb:g} GB "
                 f"per device")
    lines += [f"           {ph.name}: {ph.total / GB:.3f} GB does not fit" for ph in plan.phases
              if ph.total > plan.memory_gb * GB]
    if s.target is not None:
        lines += [f"runtime    {note}" for note in s.target.runtime_notes(peak.total)]
    lines += [f"fits with  {x}" for x in plan.suggestions]
    lines += format_roofline(plan)
    return "\n".join(lines)


def _offload_lines(plan: Plan, unit: str, scale: float) -> list[str]:
    """The offload's lines: what is in host memory in each stage and what crosses per step (the moves
    as the target compiles them, where planned); without it, each phase's total with the state offloaded."""
    s = plan.setup
    lines: list[str] = []
    if s.offload != "none":
        away = {stage: s.in_host_memory(stage) for stage in offload.STAGES}
        label = {"prepare": "prepare", "actor": "actor update", "critic": "critic update", "rest": "between steps"}
        where = "; ".join(f"{label[st]}: {', '.join(ps) or 'nothing'}"
                          for st, ps in away.items() if st != "critic" or s.state.critic is not None)
        copy = (" + the actor's params for the sampling copy" if "actor" in away["rest"] else "")
        lines.append(f"offload    {s.offload}: in host memory ({where}); {crossing_bytes(s) / scale:.3f} {unit}/device "
                     f"cross between host and device per step{copy}")
        if plan.transfers is not None:
            to_host, to_device = (sum(getattr(x, f) for x in plan.transfers) for f in ("to_host", "to_device"))
            temps = max(x.temporaries for x in plan.transfers)
            device, host = plan.at_rest
            lines.append(f"offload    the moves as the target's compiler compiles them (memory kinds device / "
                         f"{offload.HOST_MEMORY}): {to_host / scale:.3f} {unit}/device to host memory and "
                         f"{to_device / scale:.3f} back per step, moves' temporaries up to {temps / scale:.3f}; "
                         f"between steps {host / scale:.3f} {unit}/device in host memory, {device / scale:.3f} on "
                         f"the device")
    else:
        lines.append("offload    none; with --config.train.offload=state: " + ", ".join(
            f"{ph.name} {(ph.total - resident(s, ph.name) + resident(s, ph.name, 'state')) / scale:.3f}"
            for ph in plan.phases) + f" {unit}")
    return lines

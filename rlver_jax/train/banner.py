"""The first lines of a training run: what it runs (the policy, the simulator, the profiles, the
mesh, the algorithm, the rollout engine), so that a run against the wrong model, simulator or data
shows it at once."""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

from rlver_jax.simulator import backends
from rlver_jax.simulator.profiles import Profile
from rlver_jax.train.spec import RunSpec


def profile_line(profiles: Sequence[Profile]) -> str:
    """How many profiles, by language: "16 (en 8, zh 8)"."""
    languages = collections.Counter(p.language for p in profiles)
    return f"{len(profiles)} ({', '.join(f'{lang} {n}' for lang, n in sorted(languages.items()))})"


def describe(spec: RunSpec, *, params: int, train_profiles: Sequence[Profile], eval_profiles: Sequence[Profile],
             mesh_shape: dict[str, int], platform: str) -> list[str]:
    """The run's first lines. `params`: the policy's parameter count; `mesh_shape`: the mesh's axes
    and sizes; `platform`: the devices' kind (cpu, gpu, tpu)."""
    m, sim, data, loop = spec.model, spec.simulator, spec.data, spec.loop
    source = f"{m.path} (architecture {m.preset})" if m.path else f"random weights of preset {m.preset!r}"
    lora = (f"; LoRA rank {spec.lora.rank} on a frozen {spec.lora.base_dtype} base" if spec.lora.enabled
            else "; every parameter trains")
    policy = f"policy     {source}, {params / 1e6:,.1f}M parameters, {m.param_dtype} weights, {m.dtype} compute{lora}"
    simulator = f"simulator  {sim.describe()}, {sim.difficulty} user, at most {sim.rules.max_turns} policy turn(s)"
    if not sim.row.served:
        simulator += f"; a served LLM needs --config.simulator.backend={backends.first_served()}"
    held_out = (f"{data.eval_profiles}: {profile_line(eval_profiles)}" if data.eval_profiles else
                f"the last {data.eval_holdout} of them: {profile_line(eval_profiles)}" if eval_profiles else "none")
    profiles = f"profiles   {data.train_profiles}: {profile_line(train_profiles)}; held out: {held_out}"
    if eval_profiles and loop.eval_every:
        first = loop.eval_max_profiles
        profiles += (f", the first {first}" if 0 < first < len(eval_profiles) else "") + \
            f" evaluated every {loop.eval_every} steps"
    devices = math.prod(mesh_shape.values())
    mesh = f"mesh       {mesh_shape} = {devices} {platform} device(s); rules {spec.mesh.rules}"
    think = "think-then-say" if spec.rollout.think else "no thinking"
    algorithm = (f"algorithm  {spec.rl.algo}, {loop.profiles_per_step} profiles x {loop.n} dialogue(s) a step, "
                 f"{think}, {loop.steps} steps, work directory {loop.workdir}")
    engine = f"engine     {spec.engine.engine}: {spec.engine.row.summary}"  # its row's words (engines.table)
    return [policy, simulator, profiles, mesh, algorithm, engine]

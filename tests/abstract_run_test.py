"""A second run of the same settings in one process reuses the first's programs (no tracing, no
compiling), and a change that alters a program gets its own."""

import dataclasses

import jax
import numpy as np
from jax import monitoring

from configs import ppo_nothink
from rlver_jax.models.config import PRESETS
from rlver_jax.parallel import sharding
from rlver_jax.train.abstract_run import abstract_run
from rlver_jax.train.spec import RunSpec


def _spec(workdir: str, **changes) -> RunSpec:
    config = ppo_nothink.get_config("tiny")
    config.workdir = workdir
    for field, value in changes.items():
        section, name = field.split(".")
        config[section][name] = value
    return RunSpec.from_config(config)


def test_the_same_settings_get_the_same_update_program():
    first = abstract_run(_spec("/tmp/a")).update
    # another work directory, another length with the same warmup (1 step at 0.02 x 40 or x 45)
    assert abstract_run(_spec("/tmp/b", **{"train.steps": 45})).update is first
    assert abstract_run(_spec("/tmp/a", **{"rl.clip_eps_low": 0.3})).update is not first
    assert abstract_run(_spec("/tmp/a", **{"train.steps": 100})).update is not first  # a 2-step warmup
    config = ppo_nothink.get_config("tiny")
    config.optim.actor.lr = 1e-4
    assert abstract_run(RunSpec.from_config(config)).update is not first


def test_a_second_initialisation_compiles_nothing_and_draws_the_same_numbers():
    cfg = dataclasses.replace(PRESETS["tiny"], vocab_size=96)
    mesh = sharding.make_mesh((1, 2, -1))
    compiles = []

    def listen(event: str, duration: float, **_) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    monitoring.register_event_duration_secs_listener(listen)
    try:
        first = sharding.init_sharded_params(cfg, jax.random.key(3), mesh, "fsdp_tensor")
        before = len(compiles)
        again = sharding.init_sharded_params(cfg, jax.random.key(3), mesh, "fsdp_tensor")
        assert len(compiles) == before and before > 0
    finally:
        monitoring.unregister_event_duration_listener(listen)
    jax.tree.map(np.testing.assert_array_equal, first, again)
    assert jax.tree.map(lambda x: x.sharding, again) == sharding.param_shardings(cfg, mesh, "fsdp_tensor")

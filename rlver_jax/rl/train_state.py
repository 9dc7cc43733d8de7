"""The train state: a pytree of the models' parameters and optimizer states, the step counter and
the run key, with its shardings and the keys of each step's draws.

Randomness (big_vision style): the state keeps one run key; the draws of train step s (its
rollout batch, its mini-batch order, the evaluation after it) are `step_keys(rng, s)`, split
from fold_in(rng, s). Resuming at step s therefore replays exactly the draws of an unbroken run.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlver_jax.parallel import sharding

Params = Any


class ModelState(NamedTuple):
    """One model's parameters and optimizer state: what its update program reads and donates."""

    params: Params
    opt: Any


MODELS = ("actor", "critic")


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: completed train steps (one per rollout batch)
    rng: jax.Array  # uint32[2] raw key of the run, checkpointable as a plain array; never advanced
    actor: Params
    actor_opt: Any
    critic: Params | None
    critic_opt: Any | None

    def models(self) -> TrainState:
        """What the prepare program reads: the state without its optimizer states."""
        return self.replace(actor_opt=None, critic_opt=None)

    def model(self, name: str) -> ModelState:
        """The parameters and optimizer state of model `name` (one of MODELS)."""
        if name == "actor":
            return ModelState(self.actor, self.actor_opt)
        if name == "critic":
            return ModelState(self.critic, self.critic_opt)
        raise ValueError(f"no model {name!r} in the train state; use one of {MODELS}")

    def with_model(self, name: str, model: ModelState) -> TrainState:
        """The state with model `name`'s parameters and optimizer state replaced by `model`'s."""
        if name == "actor":
            return self.replace(actor=model.params, actor_opt=model.opt)
        if name == "critic":
            return self.replace(critic=model.params, critic_opt=model.opt)
        raise ValueError(f"no model {name!r} in the train state; use one of {MODELS}")


class SeedKeys(NamedTuple):
    init: jax.Array  # the policy's random initialisation
    run: jax.Array  # TrainState.rng


def seed_keys(seed: int) -> SeedKeys:
    """The two keys split from a run's seed."""
    return SeedKeys(*jax.random.split(jax.random.PRNGKey(seed)))


class StepKeys(NamedTuple):
    rollout: jax.Array  # the dialogues of the step's batch
    order: jax.Array  # the step's mini-batch order
    eval: jax.Array  # the in-loop evaluation after the step


def step_keys(rng: jax.Array, step: int | jax.Array) -> StepKeys:
    """The draws of train step `step` from the run key: on the host or traced inside a jit."""
    return StepKeys(*jax.random.split(jax.random.fold_in(rng, step), len(StepKeys._fields)))


def state_shardings(actor_tx: optax.GradientTransformation, actor: Params, actor_sh: Params,
                    critic_tx: optax.GradientTransformation | None = None, critic: Params | None = None,
                    critic_sh: Params | None = None) -> TrainState:
    """NamedShardings of the TrainState: parameters as given, optimizer states mirroring them
    (rlver_jax.parallel.sharding.opt_state_shardings), step and key replicated."""
    replicated = NamedSharding(jax.tree.leaves(actor_sh)[0].mesh, P())
    return TrainState(
        step=replicated, rng=replicated, actor=actor_sh,
        actor_opt=sharding.opt_state_shardings(actor_tx, actor, actor_sh), critic=critic_sh,
        critic_opt=None if critic is None else sharding.opt_state_shardings(critic_tx, critic, critic_sh))


def init_train_state(actor: Params, actor_tx: optax.GradientTransformation, critic: Params | None = None,
                     critic_tx: optax.GradientTransformation | None = None, seed: int = 0,
                     shardings: TrainState | None = None) -> TrainState:
    """The state before step 0 (the key from `seed_keys(seed).run`). With `shardings`
    (`state_shardings`), optimizer states are created in their shards and step and key placed;
    the parameters must already be in theirs."""
    step, rng = jnp.zeros((), jnp.int32), seed_keys(seed).run
    if shardings is None:
        return TrainState(step=step, rng=rng, actor=actor, actor_opt=actor_tx.init(actor), critic=critic,
                          critic_opt=None if critic is None else critic_tx.init(critic))
    return TrainState(
        step=jax.device_put(step, shardings.step), rng=jax.device_put(rng, shardings.rng), actor=actor,
        actor_opt=sharding.init_opt_state(actor_tx, actor, shardings.actor, shardings.actor_opt), critic=critic,
        critic_opt=None if critic is None else sharding.init_opt_state(
            critic_tx, critic, shardings.critic, shardings.critic_opt))

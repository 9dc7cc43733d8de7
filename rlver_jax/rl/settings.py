"""The typed `config.rl` and `config.optim` sections, and the optimizer they build.

`RLSettings` is hashable (static under jit); its algorithm's row (rlver_jax.rl.algorithms) says
what the update does. `Optimizer` counts the learning-rate schedule in train steps.
"""

from __future__ import annotations

import dataclasses

import optax

from rlver_jax.rl import algorithms, losses

KL_MODES = ("loss", "reward")


@dataclasses.dataclass(frozen=True)
class RLSettings:
    """The `config.rl` section as a typed, hashable record (static under jit)."""

    algo: str = "ppo"
    reward_mode: str = "final"
    gamma: float = 1.0
    lam: float = 1.0
    whiten_advantages: bool = True
    grpo_normalize_std: bool = True
    grpo_eps: float = 1e-6
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    dual_clip: float = 0.0  # 0 disables; otherwise c > 1
    value_clip: float = 0.5
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_mode: str = "loss"
    kl_estimator: str = "k3"
    loss_agg_mode: str = "token_mean"
    value_loss_agg_mode: str = "token_mean"  # the critic's loss (losses.AGG_MODES)
    ppo_epochs: int = 1
    mini_batch_size: int = 32  # train-batch rows per optimizer step (with batch_size 0)
    micro_batch_size: int = 8
    # Dialogues per train step: mini-batches are then cut in these units (a batch of more rows, one
    # per dialogue turn, gives each mini-batch proportionally more rows). 0: in the batch's rows, and
    # the batch's rows are a multiple of mini_batch_size (the last mini-batch's real rows may be fewer).
    batch_size: int = 0
    logprob_chunk: int = 1024  # tokens per row through the LM head at a time (rl.logprobs)

    def __post_init__(self):
        algorithms.algorithm(self.algo)
        checks = [("kl_mode", self.kl_mode, KL_MODES),
                  ("kl_estimator", self.kl_estimator, tuple(losses.KL_ESTIMATORS)),
                  ("loss_agg_mode", self.loss_agg_mode, tuple(losses.AGG_MODES)),
                  ("value_loss_agg_mode", self.value_loss_agg_mode, tuple(losses.AGG_MODES)),
                  ("reward_mode", self.reward_mode, ("final", "per_turn"))]
        for name, value, valid in checks:
            if value not in valid:
                raise ValueError(f"config.rl.{name}={value!r}; use one of {valid}")
        if self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"config.rl.mini_batch_size={self.mini_batch_size} is not a multiple of "
                f"config.rl.micro_batch_size={self.micro_batch_size}")
        if self.logprob_chunk < 1:
            raise ValueError(f"config.rl.logprob_chunk={self.logprob_chunk} must be >= 1 (tokens per LM-head chunk)")
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ValueError(f"config.rl.dual_clip={self.dual_clip}: use 0 (off) or a value > 1")
        if self.batch_size % self.mini_batch_size:
            raise ValueError(f"{self.batch_size} dialogues per step are not a multiple of "
                             f"config.rl.mini_batch_size={self.mini_batch_size}")

    def minibatches(self, rows: int) -> int:
        """Mini-batches per epoch over a batch of `rows` rows."""
        return (self.batch_size or rows) // self.mini_batch_size

    @property
    def algorithm(self) -> algorithms.Algorithm:
        """The row of the algorithm table for `algo`."""
        return algorithms.ALGORITHMS[self.algo]

    @property
    def uses_critic(self) -> bool:
        return self.algorithm.critic

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef != 0.0


@dataclasses.dataclass(frozen=True)
class OptimSettings:
    """AdamW with linear warmup then a constant rate, and global-norm gradient clipping."""

    lr: float = 1e-6
    warmup_ratio: float = 0.02
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """An optax transformation without the learning rate, and the learning rate at a train step: every
    optimizer step of a train step scales `tx`'s update by that step's rate, so the schedule's length
    counts train steps whatever the mini-batches per step (the reference steps its scheduler once per
    train step)."""

    tx: optax.GradientTransformation
    learning_rate: optax.Schedule


def make_optimizer(opt: OptimSettings, total_steps: int) -> Optimizer:
    """`total_steps` counts train steps."""
    warmup = max(int(opt.warmup_ratio * total_steps), 1)
    schedule = optax.join_schedules(
        [optax.linear_schedule(opt.lr / warmup, opt.lr, warmup - 1), optax.constant_schedule(opt.lr)], [warmup - 1])
    tx = optax.chain(
        optax.clip_by_global_norm(opt.grad_clip),
        optax.adamw(1.0, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay))
    return Optimizer(tx, schedule)



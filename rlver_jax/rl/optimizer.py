"""The optimizer an `OptimSettings` (rlver_jax.rl.settings) describes: AdamW with linear warmup then a
constant rate, and global-norm gradient clipping. `Optimizer` counts the learning-rate schedule in train
steps."""

from __future__ import annotations

import dataclasses

import optax

from rlver_jax.rl.settings import OptimSettings


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
    warmup = opt.warmup_steps(total_steps)
    schedule = optax.join_schedules(
        [optax.linear_schedule(opt.lr / warmup, opt.lr, warmup - 1), optax.constant_schedule(opt.lr)], [warmup - 1])
    tx = optax.chain(
        optax.clip_by_global_norm(opt.grad_clip),
        optax.adamw(1.0, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay))
    return Optimizer(tx, schedule)



"""What an ablation changes: the fields a run sets apart from its preset, and the overrides that
preset makes no-ops (said at start, so that "per-turn reward makes no difference" is never read off
a run where it could not).

A no-op is said only where it follows from the run's own settings, each with its reason:
- one update per batch (one epoch, one mini-batch): every PPO ratio is 1 when the gradient is taken,
  so the clip bounds never act, and the policy losses whose gradient at ratio 1 is the policy
  gradient (their row's `ratio_one`, rlver_jax.rl.loss_modes.POLICY_LOSSES) give the same update up
  to rounding;
- one-turn dialogues: the per-turn reward is the final emotion less the initial one, a constant that
  a group baseline removes; turn-level credit is the dialogue's own;
- partial rollouts with max_staleness below 2: every turn of a batch comes from one version.
No JAX: launch/train.py prints these before anything is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rlver_jax.rl import algorithms, loss_modes
from rlver_jax.train.spec import RunSpec, change_kind, flat_fields

CLIP_FIELDS = ("rl.clip_eps_low", "rl.clip_eps_high", "rl.dual_clip", "rl.gspo_clip_eps_low",
               "rl.gspo_clip_eps_high", "rl.cispo_clip_eps_high")


def changed_fields(record: Mapping[str, Any], preset: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{dotted field: (the preset's value, the run's)} of every field that changes what the run
    trains (`change_kind` is not "free": not where or how it is kept, laid out or watched) and differs
    from the preset (`record`, `preset`: config.to_dict() of the run and of its preset alone)."""
    now, before = flat_fields(dict(record)), flat_fields(dict(preset))
    return {k: (before.get(k), v) for k, v in sorted(now.items())
            if before.get(k) != v and change_kind(k) != "free"}


def _one_update_per_batch(spec: RunSpec) -> bool:
    rl = spec.rl
    return rl.ppo_epochs == 1 and rl.batch_size > 0  # batch_size > 0: the whole batch is one mini-batch


def no_ops(spec: RunSpec, changed: Mapping[str, tuple[Any, Any]]) -> dict[str, str]:
    """{dotted field: why it changes nothing} for the `changed` fields (changed_fields) that `spec`
    makes no-ops."""
    rl, out = spec.rl, {}
    ratio_one = ("one update per batch (rl.ppo_epochs=1, the whole batch one mini-batch): every PPO "
                 "ratio is 1 when the gradient is taken")
    if _one_update_per_batch(spec):
        for f in CLIP_FIELDS:
            if f in changed:
                out[f] = f"{ratio_one}, so the clip never acts"
        if "rl.policy_loss" in changed and _ratio_one(changed["rl.policy_loss"][0], rl.policy_loss):
            out["rl.policy_loss"] = f"{ratio_one}, where these losses give the same gradient (up to rounding)"
        if "rl.algo" in changed:
            before = algorithms.ALGORITHMS.row(changed["rl.algo"][0])
            now = algorithms.ALGORITHMS.row(rl.algo)
            if before.estimator == now.estimator and _ratio_one(before.policy_loss, now.policy_loss) \
                    and _same_but_loss(before, now):
                out["rl.algo"] = (f"{changed['rl.algo'][0]} and {rl.algo} differ only in the policy loss; "
                                  f"{ratio_one}, where both give the same gradient (up to rounding)")
    one_turn = spec.simulator.rules.max_turns == 1
    if one_turn and "rl.reward_mode" in changed and rl.estimator_kind.grouped:
        out["rl.reward_mode"] = ("one-turn dialogues: the per-turn reward is the final emotion less the initial "
                                 f"one, a constant that the {rl.estimator} group baseline removes")
    if one_turn and "rl.turn_credit_weight" in changed:
        out["rl.turn_credit_weight"] = "one-turn dialogues: a turn's credit is the whole dialogue's"
    if "rollout.partial_rollouts" in changed and spec.loop.max_staleness < 2:
        out["rollout.partial_rollouts"] = (f"rollout.max_staleness={spec.loop.max_staleness}: every turn of a batch "
                                           "is sampled by one version anyway")
    return out


def _ratio_one(*losses: str) -> bool:
    """Whether every one of `losses` is a policy loss with the plain policy gradient at ratio 1 (a
    preset's "", its algorithm's loss, is not known here: no)."""
    return all(loss in loss_modes.POLICY_LOSSES and loss_modes.POLICY_LOSSES[loss].ratio_one for loss in losses)


def _same_but_loss(a: algorithms.Algorithm, b: algorithms.Algorithm) -> bool:
    """Whether two rows differ in nothing but the policy loss (their clip bounds aside: no-ops too)."""
    skip = {"policy_loss", "clip_eps_high", "default_n"}
    return all(getattr(a, f.name) == getattr(b, f.name) for f in dataclasses.fields(a) if f.name not in skip)


def banner_lines(changed: Mapping[str, tuple[Any, Any]], noop: Mapping[str, str]) -> list[str]:
    """The banner's lines: the ablation set (or that the run is the preset), then one per no-op."""
    if not changed:
        lines = ["ablation   none: the preset as it is"]
    else:
        lines = ["ablation   " + "; ".join(f"{k}={v!r} (preset {p!r})" for k, (p, v) in changed.items())]
    return lines + [f"no-op      {k}={v!r} changes nothing here: {noop[k]}" for k, (_, v) in changed.items()
                    if k in noop]

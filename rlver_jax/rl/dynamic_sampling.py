"""DAPO's dynamic sampling on the rollout side: a step's groups without signal sampled again.

A group whose trained dialogues all earn the same reward (or that has fewer than two) gives every
dialogue a group-relative advantage of 0: it carries no gradient and only dilutes the batch (Yu et
al. 2025, DAPO, Eq. 11; verl's `filter_groups`). After a step's rollouts, `refill` samples each such
group again, with a fresh profile and fresh sampling keys, up to `retries` times, and puts the first
new group that has signal in its place: the batch keeps its shape (the same group slots, ids and
dialogue indices), so the jitted update does not recompile. What is still without signal after
the retries stays in the batch and is dropped from the loss by the update
(rlver_jax.rl.estimators.kept_rows; metric `filtered_groups`).

Each process re-samples its own groups (they are whole on it), and a group slot's draws are a
pure function of (seed, step, retry, group id), so a resumed run samples the same dialogues.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from rlver_jax.rl.batch import dialogue_return
from rlver_jax.rollout.sequence import DialogueSequence

log = logging.getLogger(__name__)


def groups_without_signal(dialogues: Sequence[DialogueSequence]) -> set[int]:
    """The group ids of `dialogues` whose trainable dialogues are fewer than two or all return the
    same (rlver_jax.rl.batch.dialogue_return of their stored rewards, the score the update compares)."""
    returns: dict[int, list[float]] = {}
    for seq in dialogues:
        returns.setdefault(seq.group, [])
        if seq.trainable:
            returns[seq.group].append(dialogue_return(seq))
    return {g for g, r in returns.items() if len(r) < 2 or len(set(r)) < 2}


def refill_profile(profiles: Sequence[Any], seed: int, step: int, retry: int, group: int) -> Any:
    """The profile group `group` of step `step` samples on retry `retry` (1, 2, ...): a uniform draw,
    a pure function of its arguments."""
    return profiles[int(np.random.default_rng([seed, step, retry, group]).integers(len(profiles)))]


async def refill(run: Callable[[list[Any]], Awaitable[list[DialogueSequence]]], requests: Sequence[Any],
                 dialogues: list[DialogueSequence], *, retries: int, stride: int,
                 profile: Callable[[int, int], Any]) -> tuple[list[DialogueSequence], dict[str, int]]:
    """`dialogues` (the results of `requests`, rollout.episodes.EpisodeRequest, in order) with each
    group without signal replaced by the first of up to `retries` new samples that has some.

    run: runs requests to the end (EpisodeRunner.run with the step's version schedule, so a refill's
      turns are written by the versions of the batch's: rollout.versions).
    stride: the step's dialogue count: retry r samples a request's slot with the sampling index
      `index + r * stride`, so no two samples of a step share a key.
    profile: (retry, group id) -> the profile the group samples on that retry (`refill_profile`).
    Returns the dialogues and counts: `resampled` groups (tried again), `refilled` (replaced by a
    group with signal), `retries` (rounds run)."""
    dialogues = list(dialogues)
    pending = groups_without_signal(dialogues)
    stats = {"resampled": len(pending), "refilled": 0, "retries": 0}
    for retry in range(1, retries + 1):
        if not pending:
            break
        slots = [i for i, r in enumerate(requests) if r.group in pending]
        drawn = {g: profile(retry, g) for g in pending}
        again = [dataclasses.replace(requests[i], profile=drawn[requests[i].group],
                                     index=requests[i].index + retry * stride)
                 for i in slots]
        fresh = await run(again)
        better = pending - groups_without_signal(fresh)
        for i, seq in zip(slots, fresh):
            if requests[i].group in better:
                dialogues[i] = seq
        stats["retries"], stats["refilled"] = retry, stats["refilled"] + len(better)
        pending -= better
    if stats["resampled"]:
        log.info("dynamic sampling: %d groups without signal, %d refilled in %d retries, %d left to the update's "
                 "filter", stats["resampled"], stats["refilled"], stats["retries"], len(pending))
    return dialogues, stats


async def refill_step(rl: Any, run: Callable[[list[Any]], Awaitable[list[DialogueSequence]]], requests: Sequence[Any],
                      dialogues: list[DialogueSequence], profiles: Sequence[Any], seed: int, step: int,
                      stride: int) -> list[DialogueSequence]:
    """The training loop's hook: step `step`'s dialogues, refilled (`refill`) when `rl`
    (rlver_jax.rl.settings.RLSettings) has dynamic sampling with retries; as they are otherwise."""
    if not (rl.dynamic_sampling and rl.dynamic_sampling_retries):
        return dialogues
    out, _ = await refill(run, requests, dialogues, retries=rl.dynamic_sampling_retries, stride=stride,
                          profile=lambda retry, group: refill_profile(profiles, seed, step, retry, group))
    return out

"""Shared inputs for the RL tests: multi-turn policy masks, strict rank promotion, dialogues of
random tokens collated into a training batch, and a dialogue scored outside the rollouts."""

import jax
import numpy as np
import pytest

from rlver_jax.rl.batch import collate
from rlver_jax.rollout import rewards
from rlver_jax.rollout.sequence import DialogueSequence


@pytest.fixture(autouse=True)
def strict_ranks():
    with jax.numpy_rank_promotion("raise"):
        yield


def score(seq: DialogueSequence, name: str) -> DialogueSequence:
    """`rewards.score` by a plain source, run to its end without an event loop (a plain source never
    suspends it), so that code already inside one can call it too."""
    coroutine = rewards.score(seq, name)
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError(f"reward source {name!r} awaited: score it in the rollouts' event loop")


def random_policy_mask(rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
    """Rows of alternating user (0) / assistant (1) segments, each with its own padded length."""
    mask = np.zeros((batch, length), np.float32)
    for b in range(batch):
        row_len = rng.integers(length // 2, length + 1)
        t, policy = 0, False
        while t < row_len:
            seg = int(rng.integers(1, 6))
            mask[b, t : min(t + seg, row_len)] = float(policy)
            t, policy = t + seg, not policy
    return mask


def dialogue(rng, group, emotions, n_turns=2, ctx=5, turn=4, format_failure=False):
    """Tokens: [ctx user tokens][turn policy tokens] repeated n_turns times; the paper's reward ("final")."""
    tokens, mask, ends = [], [], []
    for _ in range(n_turns):
        tokens += list(rng.integers(1, 500, ctx))
        mask += [0] * ctx
        tokens += list(rng.integers(1, 500, turn))
        mask += [1] * turn
        ends.append(len(tokens) - 1)
    return score(DialogueSequence(
        profile_id=f"p{group}", group=group, tokens=tokens, policy_mask=mask,
        logprobs=[0.0] * len(tokens), turn_ends=ends, emotions=emotions,
        end_reason="format_failure" if format_failure else "turn_limit", format_failure=format_failure), "final")


def training_batch():
    """Two GRPO groups of two two-turn dialogues, one rewarded and one not in each."""
    rng = np.random.default_rng(1)
    seqs = [dialogue(rng, 0, [30.0, 60.0, 90.0]), dialogue(rng, 0, [30.0, 20.0, 5.0]),
            dialogue(rng, 1, [30.0, 40.0, 70.0]), dialogue(rng, 1, [30.0, 10.0, 0.0])]
    return collate(seqs, batch_size=4, length_multiple=8)

"""Shared inputs for the RL math tests: multi-turn policy masks and strict rank promotion."""

import jax
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def strict_ranks():
    with jax.numpy_rank_promotion("raise"):
        yield


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

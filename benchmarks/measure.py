"""Measurements the benchmarks share: wall time of a call, this machine's matmul peak, and the
parameters a token meets in a matmul (the FLOP counts' main term)."""

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rlver_jax.models.config import Qwen2Config


def best_of(fn: Callable[[], None], repeats: int) -> float:
    """Least wall seconds of `repeats` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def matmul_peak(dtype, repeats: int = 3) -> float:
    """FLOP/s of a 4096x4096 jnp.dot in `dtype` (fp32 accumulation), best of `repeats`."""
    n = 4096
    a = jnp.ones((n, n), dtype)
    dot = jax.jit(lambda a: jnp.dot(a, a, preferred_element_type=jnp.float32))
    dot(a).block_until_ready()
    return 2 * n**3 / best_of(lambda: dot(a).block_until_ready(), repeats)


def matmul_params(config: Qwen2Config) -> int:
    """Parameters a token meets in a matmul: all but the embedding table, plus the LM head."""
    embed = config.vocab_size * config.hidden_size
    return config.num_params() - (0 if config.tie_word_embeddings else embed)

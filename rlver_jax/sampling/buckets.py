"""Shape buckets: the sizes host arrays are padded to, so a jitted program compiles once per bucket
rather than once per size (prompt lengths, batch rows, training sequence lengths)."""

from __future__ import annotations

from collections.abc import Sequence

MIN_PROMPT_BUCKET = 16  # prompt-length buckets start here: tiny prompts share one program
# The rollout policy's prompt-length buckets: powers of two and 1.5x powers of two from
# MIN_PROMPT_BUCKET (at most a third of a bucket is padding).
LENGTH_BUCKETS = tuple(sorted({2**k for k in range(4, 18)} | {3 * 2**k for k in range(3, 17)}))
# Counts of packed training rows, in units of a micro-batch (rlver_jax.rl.packing): 1, 2, ..., 8, 10, 12, 14,
# 16, 20, ...: less than a fifth of a count is padding, at most four programs per doubling of the count.
ROW_COUNT_BUCKETS = tuple(sorted({1, 2, 3} | {m * 2**k for m in (4, 5, 6, 7) for k in range(20)}))


def bucket(n: int, buckets: Sequence[int] | None = None, minimum: int = 1, *, multiple: int = 0) -> int:
    """The size to pad `n` to.

    buckets given: the smallest of them >= n (an error when none is). Else, multiple > 0: the
    smallest multiple of `multiple` >= n, at least `multiple`. Else: the smallest power of two
    >= n, at least `minimum`.
    """
    if buckets is not None:
        fitting = [b for b in sorted(buckets) if b >= n]
        if not fitting:
            raise ValueError(f"size {n} exceeds the largest bucket {max(buckets)}; add a larger bucket")
        return fitting[0]
    if multiple > 0:
        return max(multiple, -(-n // multiple) * multiple)
    return max(minimum, 1 << max(n - 1, 0).bit_length())

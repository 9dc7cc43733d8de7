"""Shape buckets: the sizes arrays are padded to (one compiled program per bucket)."""

import pytest

from rlver_jax.sampling.buckets import LENGTH_BUCKETS, MIN_PROMPT_BUCKET, ROW_COUNT_BUCKETS, bucket


def test_bucket_sizes():
    assert [bucket(n, None) for n in (1, 2, 3, 8, 9)] == [1, 2, 4, 8, 16]
    assert bucket(3, None, minimum=16) == 16
    assert bucket(100, [64, 256, 128]) == 128


def test_multiples_and_errors():
    # Training sequence lengths: multiples of 64, at least one multiple.
    assert [bucket(n, multiple=64) for n in (0, 1, 64, 65, 200)] == [64, 64, 64, 128, 256]
    with pytest.raises(ValueError, match="exceeds the largest bucket 128"):
        bucket(129, [64, 128])


def test_prompt_length_buckets():
    assert LENGTH_BUCKETS[:7] == (16, 24, 32, 48, 64, 96, 128) and LENGTH_BUCKETS[0] == MIN_PROMPT_BUCKET
    assert LENGTH_BUCKETS[-2:] == (2**17, 3 * 2**16)
    # At most a third of a bucket is padding: each bucket is at most 1.5x the one below.
    assert all(b / a <= 1.5 for a, b in zip(LENGTH_BUCKETS, LENGTH_BUCKETS[1:]))
    assert [bucket(n, LENGTH_BUCKETS) for n in (1, 17, 25, 100)] == [16, 24, 32, 128]


def test_packed_row_count_buckets():
    """Counts of packed rows in micro-batches (rlver_jax.rl.packing): every count to 8, then four a
    doubling; less than a fifth of a bucket is padding."""
    assert ROW_COUNT_BUCKETS[:14] == (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24)
    assert all((bucket(n, ROW_COUNT_BUCKETS) - n) / bucket(n, ROW_COUNT_BUCKETS) < 0.2 for n in range(1, 5000))

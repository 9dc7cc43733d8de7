"""Packed training rows (config.rl.pack_rows): a batch's rows laid end to end in rows of the batch's
length T, so the update's model passes run on fewer rows. Host side, numpy only (the planner and
the collation read it); the device side is rlver_jax.rl.logprobs.PackedRows.

A training row (a dialogue, or one policy turn under think_history "drop": rlver_jax.rl.batch)
holds its tokens from slot 0, padding after. Packed, whole rows share one row of T slots, one after
another, each a segment. A layout is one int32 array, `source` [P, T]: the flat index (row x T +
slot) in the rows' layout of the token at each packed slot, -1 at an empty one. The device reads
everything from it: the packed tokens, the segment ids that confine attention to a row, the
positions (RoPE restarts at each segment) and, back, each output in its row's layout, where the
estimators, losses and metrics run as without packing.

A step has two kinds of layout: `prepare`'s (old log-probs, values) of each process's rows in any
order, and the update's, one per micro-batch of the step's shuffle (its rows come from
rlver_jax.rl.update.minibatch_rows), so every optimizer step and every micro-batch sees the rows it
sees unpacked, and only the model's summation order changes. A packed row holds at most SEGMENTS
rows: cuDNN's packed attention sizes its arrays by a static bound.

The count of packed rows is a bucket of its own (`packed_count`, ROW_COUNT_BUCKETS), so nothing
recompiles per batch; the planner reads it from the rows' lengths: `packed_rows` (prepare's) and
`micro_rows_bound` (the update's micro-batches', whatever the shuffle).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlver_jax.rl.batch import RowTable, policy_positions
from rlver_jax.sampling.buckets import ROW_COUNT_BUCKETS, bucket

# The most rows a packed row holds (the model's `max_segments` on packed rows): early turn rows of a
# 15,360-token batch are a tenth of it and less.
SEGMENTS = 16


def bins(lengths: Sequence[int], length: int, most: int) -> list[list[int]]:
    """The rows (indices into `lengths`) of each packed row of `length` slots and at most `most`
    rows, first-fit decreasing (the longest row first, ties by index); rows of length 0 (padding)
    are left out; each packed row lists its rows in ascending order."""
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-int(lengths[i]), i))
    free: list[int] = []
    out: list[list[int]] = []
    for i in order:
        n = int(lengths[i])
        if n > length:
            raise ValueError(f"a row of {n} tokens does not fit packed rows of {length}")
        k = next((k for k, f in enumerate(free) if f >= n and len(out[k]) < most), len(out))
        if k == len(out):
            free.append(length)
            out.append([])
        free[k] -= n
        out[k].append(i)
    return [sorted(b) for b in out]


def packed_count(needed: int, unit: int, limit: int) -> int:
    """The packed rows of a layout that needs `needed`: `unit` x the smallest of ROW_COUNT_BUCKETS
    that holds it, at most `limit` (the rows unpacked: packing never adds rows)."""
    return min(limit, unit * bucket(max(-(-needed // unit), 1), ROW_COUNT_BUCKETS))


def packed_rows(lengths: Sequence[int], length: int, most: int, unit: int = 1, limit: int | None = None) -> int:
    """The packed rows of rows of `lengths` (0: padding) in rows of `length` slots holding at most
    `most` rows each, as `packed_count` buckets them (`limit` default: len(lengths))."""
    return packed_count(len(bins(lengths, length, most)), unit, len(lengths) if limit is None else limit)


def micro_rows_bound(lengths: Sequence[int], length: int, micro: int, unit: int = 1) -> int:
    """The most packed rows the update's micro-batches of `micro` of these rows can take, whatever
    the shuffle (`micro_layouts` gives the step's own, often fewer): first fit leaves at most one
    packed row half empty or less besides those full by count (SEGMENTS), so a micro-batch of S
    tokens takes at most 2 S / T + 1 + micro / SEGMENTS, S at most the `micro` longest rows'; as
    `micro_layouts` buckets it, at most `micro`. For the planner, with `packed_rows` for prepare."""
    most = int(np.sum(np.sort(np.asarray(lengths))[::-1][:micro]))
    needed = 2 * most // length + 1 + -(-micro // SEGMENTS)
    return packed_count(needed, unit if micro % unit == 0 else 1, micro)


def layout(packed: list[list[int]], lengths: Sequence[int], length: int, rows: int,
           row_ids: Sequence[int] | None = None) -> np.ndarray:
    """`source` [rows, length] of the packed rows `packed` (`bins`), their rows' tokens from slot 0
    on, rows past them empty: row r's slot t is at row_ids[r] x length + t (row_ids default: r)."""
    out = np.full((rows, length), -1, np.int32)
    for p, members in enumerate(packed):
        at = 0
        for r in members:
            n = int(lengths[r])
            out[p, at:at + n] = (r if row_ids is None else row_ids[r]) * length + np.arange(n)
            at += n
    return out


def scored(source: np.ndarray, policy: np.ndarray) -> np.ndarray:
    """[..., T] bool: the packed slots the LM head scores, the policy tokens of `policy` (the
    rows' mask [R, T] that `source` indexes); a segment's first slot never (nothing predicts it,
    as unpacked: rlver_jax.rl.logprobs.token_logprobs)."""
    length = policy.shape[-1]
    flat = np.concatenate([policy.reshape(-1), [False]])  # -1 reads the False past the rows
    return flat[source] & (source % length != 0)


def prepare_layout(table: RowTable, process: int, unit: int, row_ids: Sequence[int] | None = None
                   ) -> dict[str, np.ndarray]:
    """This process's packed rows for `prepare`: `pack_source` [P, T] (rows' slots numbered by
    row_ids[r] x T + t: the rows' places in the global batch) and `pack_positions` [P, C] (the slots
    the LM head scores, rlver_jax.rl.batch.policy_positions). P and C are every process's most
    (from `table`), so the processes agree; P is a multiple of `unit` (its batch shards, and of the
    global micro-batch), at most the unpacked rows."""
    lengths, policy = table.lengths, table.policy
    rows, length = policy.shape[1:]
    packed = [bins(lengths[q], length, SEGMENTS) for q in range(len(lengths))]
    count = packed_count(max(len(b) for b in packed), unit, rows)
    sources = [layout(b, lengths[q], length, count) for q, b in enumerate(packed)]
    most = max(int(scored(s, policy[q]).sum(-1).max(initial=0)) for q, s in enumerate(sources))
    source = layout(packed[process], lengths[process], length, count, row_ids)
    return {"pack_source": source,
            "pack_positions": policy_positions(scored(sources[process], policy[process]), most)}


def micro_layouts(lengths: np.ndarray, policy: np.ndarray, order: np.ndarray, micro: int, unit: int = 1
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The update's packed rows, per micro-batch of each mini-batch of `order` ([S, R] rows of the
    global batch, rlver_jax.rl.update.minibatch_rows; `lengths` [B] and `policy` [B, T] of every
    row): (`source` [S, M, P, T], its slots numbered u x T + t for the micro-batch's u-th row;
    `positions` [S, M, P, C]), M = R / micro, P the most any micro-batch needs (a multiple of `unit`
    where that divides `micro`, at most `micro`), C their most scored slots (policy_positions' width)."""
    length = policy.shape[1]
    groups = order.reshape(order.shape[0], -1, micro)
    packed = [[bins(lengths[g], length, SEGMENTS) for g in mini] for mini in groups]
    count = packed_count(max(len(b) for mini in packed for b in mini), unit if micro % unit == 0 else 1, micro)
    source = np.stack([np.stack([layout(b, lengths[g], length, count) for b, g in zip(mini, rows)])
                       for mini, rows in zip(packed, groups)])
    mask = np.stack([np.stack([scored(s, policy[g]) for s, g in zip(mini, rows)])
                     for mini, rows in zip(source, groups)])
    positions = policy_positions(mask.reshape(-1, length))
    return source, positions.reshape(source.shape[:3] + positions.shape[-1:])

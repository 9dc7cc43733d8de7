"""What the processes of a multi-host run exchange on the host side: JSON records, all-gathered.

Rollouts run per process (each on its own dialogues and devices); what every process then needs
from the others, the finished dialogues of a step for the metrics, the transcripts and the agreed
batch shapes, or an evaluation's records, travels as JSON through one small device all-gather
(jax.experimental.multihost_utils.process_allgather of the UTF-8 bytes, after one of their
sizes). With one process nothing is exchanged.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from rlver_jax.rollout.sequence import DialogueSequence


def allgather_json(obj: Any) -> list[Any]:
    """Every process's `obj` (JSON-serialisable), in process order; a collective: every process
    calls it at the same point. With one process, [obj] as it is."""
    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(json.dumps(obj, ensure_ascii=False).encode("utf-8"), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [json.loads(bytes(row[:n]).decode("utf-8")) for row, n in zip(gathered, sizes)]


def allgather_dialogues(local: Sequence[DialogueSequence], owner: np.ndarray) -> list[DialogueSequence]:
    """Every process's dialogues (token views included), placed by `owner` (the process of each
    row, sharding.row_processes): process p's list fills the rows owned by p, in order."""
    if jax.process_count() == 1:
        return list(local)
    parts = allgather_json([dataclasses.asdict(s) for s in local])
    out: list[DialogueSequence | None] = [None] * len(owner)
    for p, part in enumerate(parts):
        rows = np.flatnonzero(owner == p)
        if len(rows) != len(part):
            raise AssertionError(f"process {p} sent {len(part)} dialogues for its {len(rows)} rows")
        for r, fields in zip(rows, part):
            out[r] = DialogueSequence(**fields)
    return out  # type: ignore[return-value]


def share(n: int) -> range:
    """This process's contiguous share of n items split over the processes (sizes differ by at
    most one; the first processes take the larger shares)."""
    per, extra = divmod(n, jax.process_count())
    p = jax.process_index()
    start = p * per + min(p, extra)
    return range(start, start + per + (p < extra))

"""What the processes of a multi-host run exchange on the host side: JSON records, all-gathered.

Rollouts run per process (each on its own dialogues and devices); what every process then needs
from the others, the finished dialogues of a step for the metrics, the transcripts and the agreed
batch shapes, or an evaluation's records, travels as JSON through one small device all-gather
(jax.experimental.multihost_utils.process_allgather of the UTF-8 bytes, after one of their
sizes). The callers turn their objects into JSON records and back (a dialogue:
rlver_jax.rollout.sequence); this module knows only JSON.

With one process nothing is exchanged, and nothing here imports JAX or touches a device: a
process is one of many only in a jax.distributed run (launch/train.py and launch/eval.py start
one through sharding.maybe_initialize_distributed), so an evaluation of served models, which never
imports JAX, runs these functions as the single process it is.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Sequence
from typing import Any

import numpy as np


def _distributed() -> types.ModuleType | None:
    """The jax module when this process is one of a jax.distributed run of several processes, else
    None. A process that never imported jax is in no such run, and is not made to import it (~2 s
    of start-up); outside such a run no device is touched (jax.process_index() would start the
    accelerator backend, and on a GPU host claim the memory of a GPU a local server uses)."""
    jax = sys.modules.get("jax")
    if jax is None or not jax.distributed.is_initialized() or jax.process_count() == 1:
        return None
    return jax


def process_index() -> int:
    """This process's index in a jax.distributed run; 0 outside one (no device touched)."""
    jax = _distributed()
    return 0 if jax is None else jax.process_index()


def allgather_json(obj: Any) -> list[Any]:
    """Every process's `obj` (JSON-serialisable), in process order; a collective: every process
    calls it at the same point. With one process, [obj] as it is."""
    if _distributed() is None:
        return [obj]
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(obj, ensure_ascii=False).encode("utf-8"), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [json.loads(bytes(row[:n]).decode("utf-8")) for row, n in zip(gathered, sizes)]


def allgather_placed(local: Sequence[Any], owner: np.ndarray) -> list[Any]:
    """Every process's JSON-serialisable items (one per row) placed by `owner` (the process of
    each row, sharding.row_processes): process p's list fills the rows owned by p, in order; a
    collective. With one process, `local` as it is (as a list, nothing encoded)."""
    if _distributed() is None:
        return list(local)
    parts = allgather_json(list(local))
    out: list[Any] = [None] * len(owner)
    for p, part in enumerate(parts):
        rows = np.flatnonzero(owner == p)
        if len(rows) != len(part):
            raise AssertionError(f"process {p} sent {len(part)} items for its {len(rows)} rows")
        for r, item in zip(rows, part):
            out[r] = item
    return out


def share(n: int) -> range:
    """This process's contiguous share of n items split over the processes (sizes differ by at
    most one; the first processes take the larger shares)."""
    jax = _distributed()
    if jax is None:
        return range(n)
    per, extra = divmod(n, jax.process_count())
    p = jax.process_index()
    start = p * per + min(p, extra)
    return range(start, start + per + (p < extra))

"""The collectives of a compiled program, read from its optimized HLO (hlo_cost.program_cost counts
them by how often they run): per collective its kind, its group of devices, the bytes each device
sends on a ring over that group, and whether the group stays inside one ICI / NVLink domain (a TPU
slice, a GPU node) or crosses the data-centre network (slices, nodes).

Bytes per device on a ring of n devices (the volume every bandwidth-optimal algorithm moves):
all-reduce 2 (n - 1) / n of the array, all-gather (n - 1) / n of the gathered output,
reduce-scatter (n - 1) / n of the input, all-to-all (n - 1) / n of the array, a
collective-permute its array once. A collective's `steps` are its ring's sequential steps (n - 1,
twice for an all-reduce), each paying the link's latency. A collective the compiler scheduled
asynchronously (`*-start` ... `*-done`, or inside an async computation) may overlap compute; a
synchronous one may not.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

import numpy as np

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_START = {f"{k}-start": k for k in ("all-reduce", "all-gather", "collective-permute")}


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction: what each device sends and over which links."""

    kind: str
    bytes: float  # per device, on a ring over the group
    steps: int  # sequential ring steps
    far: bool  # the group crosses domains (slices, nodes): the data-centre network
    asynchronous: bool


def kind_of(op: str) -> str | None:
    """The collective an HLO op name is ("all-gather-start" -> "all-gather"), or None."""
    return op if op in KINDS else _START.get(op)


def groups(rest: str) -> list[list[int]]:
    """The replica groups of an instruction's attributes: explicit ({{0,1},{2,3}}) or the iota form
    ([G,S]<=[dims]T(perm)); [] when absent (every device one group)."""
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", rest)
    if m:
        shape = [int(x) for x in m.group(1).split(",")]
        dims = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        return ids.reshape(shape[0], -1).tolist() if len(shape) > 1 else [ids.reshape(-1).tolist()]
    m = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", rest)
    if m and m.group(1):
        return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
    m = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", rest)
    if m and m.group(1):
        return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", m.group(1))]
    return []


def collective(kind: str, out_bytes: float, in_bytes: float, rest: str, domains: Sequence[int] | None,
               asynchronous: bool) -> Collective:
    """The collective `kind` of an instruction whose output and operands hold `out_bytes` and
    `in_bytes` (a `*-start`'s output tuple counts its largest array: hlo_cost passes it), on the
    devices whose domains are `domains` (by the program's device ids; None: one domain)."""
    members = groups(rest)
    n = max((len(g) for g in members), default=len(domains) if domains else 1)
    if kind == "collective-permute":
        n_bytes, steps = out_bytes, 1
    elif n <= 1:
        n_bytes, steps = 0.0, 0
    else:
        share = (n - 1) / n
        n_bytes = {"all-reduce": 2 * share * out_bytes, "all-gather": share * out_bytes,
                   "reduce-scatter": share * in_bytes, "all-to-all": share * out_bytes}[kind]
        steps = 2 * (n - 1) if kind == "all-reduce" else n - 1
    far = bool(domains) and any(len({domains[i] for i in g if i < len(domains)}) > 1 for g in members or
                                [list(range(len(domains)))])
    return Collective(kind, n_bytes, steps, far, asynchronous)

"""The cost model of the planner's roofline: FLOPs and HBM bytes of a compiled program per device,
read from its optimized HLO text, each operation weighted by how often it runs (a while loop's body
by its trip count), and `Cost.seconds`, the roofline of those figures against a chip's published
peak (rlver_jax.parallel.chips.Chip). An estimate, not a measurement: `program_cost` says what
it counts.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from rlver_jax.models import ragged_attention
from rlver_jax.parallel.chips import Chip
from rlver_jax.train.planner import collectives


@dataclasses.dataclass(frozen=True)
class Cost:
    """Per-device work of one compiled program, loops counted by their trip counts."""

    flops: float  # matmuls (dot, convolution) and the attention kernels' matmuls
    bytes: float  # HBM bytes read and written by the program's top-level operations
    xla_flops: float  # XLA's cost_analysis(): every loop body counted once
    xla_bytes: float
    unknown_loops: int = 0  # while loops whose trip count could not be read: counted once
    kernel_flops: float = 0.0  # of `flops`, the attention kernels' (splash, cuDNN, ragged), by formula
    ragged_bytes: float = 0.0  # of `bytes`, the ragged kernel's key/value reads, every cache row whole
    ragged_flops: float = 0.0  # of `kernel_flops`, the ragged kernel's, every cache row whole
    # Collectives (planner.collectives): bytes each device sends, inside a domain (ICI, NVLink) or
    # across (DCN, a node's network), scheduled asynchronously or not; their ring steps (latency).
    near_sync: float = 0.0
    near_async: float = 0.0
    far_sync: float = 0.0
    far_async: float = 0.0
    near_steps: float = 0.0
    far_steps: float = 0.0
    collectives: float = 0.0  # collective instructions run
    grid_steps: float = 0.0  # the Pallas kernels' grid steps (splash's, the ragged kernel's)
    ops: float = 0.0  # top-level operations run (fusions, matmuls, copies, collectives, kernels)

    def seconds(self, chip: Chip) -> float:
        """Roofline: the larger of compute time at the bf16 peak and HBM time at full bandwidth."""
        return max(self.flops / (chip.bf16_tflops * 1e12), self.bytes / (chip.hbm_gb_s * 1e9))

    def at_fill(self, fraction: float) -> Cost:
        """The same program with the ragged kernel (models.ragged_attention) reading `fraction` of
        each cache row, as it does at a mean fill of that fraction of the slots (it fetches no key
        block past a row's fill, and computes none)."""
        cut = 1 - min(max(fraction, 0.0), 1.0)
        return dataclasses.replace(self, bytes=self.bytes - cut * self.ragged_bytes,
                                   flops=self.flops - cut * self.ragged_flops,
                                   kernel_flops=self.kernel_flops - cut * self.ragged_flops)


_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([\w\-]+)\((.*)$")
_COMP = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?\s*->.*\{\s*$")
_ARRAY = re.compile(r"\b(pred|s4|u4|s8|u8|s16|u16|s32|u32|s64|u64|f8\w*|bf16|f16|f32|f64|c64|c128)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8,
          "u64": 8, "bf16": 2, "f16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16}
# Operations that move no HBM bytes of their own (views, tuples, control).
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
         "after-all", "partition-id", "replica-id", "opt-barrier", "copy-done", "all-reduce-done",
         "all-gather-done", "collective-permute-done", "async-done", "send-done", "recv-done"}


def _arrays(shape_text: str) -> list[tuple[str, tuple[int, ...]]]:
    return [(t, tuple(int(x) for x in dims.split(",") if x)) for t, dims in _ARRAY.findall(shape_text)]


def _nbytes(shape_text: str) -> float:
    return sum(_BYTES.get(t, 4 if not t.startswith("f8") else 1) * math.prod(d) for t, d in _arrays(shape_text))


@dataclasses.dataclass
class _Instr:
    name: str
    shape: str
    op: str
    rest: str  # operands and attributes
    root: bool = False


def _computations(hlo: str) -> tuple[dict[str, list[_Instr]], str]:
    comps: dict[str, list[_Instr]] = {}
    entry, current = "", None
    for line in hlo.splitlines():
        if current is None:
            m = _COMP.match(line)
            if m and "=" not in line.split("(")[0]:
                current = m.group(2)
                comps[current] = []
                if m.group(1):
                    entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTR.match(line)
        if m:
            root, *fields = m.groups()
            comps[current].append(_Instr(*fields, root=bool(root)))
    return comps, entry


def _called(rest: str, key: str) -> list[str]:
    m = re.search(r"\b" + key + r"=(\{[^}]*\}|%?[\w.\-]+)", rest)
    return [c.strip().lstrip("%") for c in m.group(1).strip("{}").split(",") if c.strip()] if m else []


def _trip_count(cond: list[_Instr], comps: dict[str, list[_Instr]] | None = None, depth: int = 0) -> int | None:
    """N of a loop whose condition compares its counter against constant(N) (jax's scan and
    fori_loop with static bounds, a decode loop's step < max_new_tokens), in the condition or in a
    fusion it calls; None for a bound computed at run time."""
    consts = {i.name: int(m.group(1)) for i in cond if i.op == "constant" and (m := re.match(r"(-?\d+)\)", i.rest))}
    for i in cond:
        if i.op == "compare" and re.search(r"direction=(LT|GT)", i.rest):
            bound = [consts[o] for o in _operands(i) if o in consts]
            if bound:
                return max(bound[0], 0)
    for i in cond if comps is not None and depth < 4 else ():
        if i.op == "fusion":
            called = [comps.get(c, []) for c in _called(i.rest, "calls")]
            bound = [consts[o] for o in _operands(i) if o in consts]
            if bound and any(j.op == "compare" and re.search(r"direction=(LT|GT)", j.rest) for c in called for j in c):
                return max(bound[0], 0)  # a compare fused with the counter, the bound an operand (XLA:CPU)
            for c in _called(i.rest, "calls"):
                if (n := _trip_count(comps.get(c, []), comps, depth + 1)) is not None:
                    return n
    return None


def _dot_flops(instr: _Instr, shapes: dict[str, str]) -> float:
    out = _arrays(instr.shape)
    operands = re.findall(r"%([\w.\-]+)", instr.rest.split(")")[0])
    if not out or not operands:
        return 0.0
    out_elems = math.prod(out[0][1])
    if instr.op == "dot":
        lhs = _arrays(shapes.get(operands[0], ""))
        dims = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instr.rest)
        if not lhs or not dims:
            return 0.0
        contract = math.prod(lhs[0][1][int(d)] for d in dims.group(1).split(",") if d)
        return 2.0 * out_elems * contract
    # convolution (TPU's form of most matmuls): 2 x output x (input features x kernel window)
    rhs = _arrays(shapes.get(operands[1], "")) if len(operands) > 1 else []
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", instr.rest)
    if not rhs or not labels:
        return 0.0
    kernel = labels.group(2)
    contract = math.prod(size for size, c in zip(rhs[0][1], kernel) if c not in "o0123456789")
    # The window's taps that can meet an input element: the TPU compiler writes some matmuls as
    # convolutions whose window is mostly padding (a projection onto 28 heads: an input of 1
    # padded by 27 each side under a window of 28) or holes (attention's scores: a window of 8
    # over rows dilated by 8), where each output reads one element per spatial dim.
    window = re.search(r"window=\{size=([\dx]+)(.*?)\}", instr.rest)
    lhs = _arrays(shapes.get(operands[0], ""))
    if window and lhs:
        dilate = re.search(r"lhs_dilate=([\dx]+)", window.group(2))
        sizes = [int(n) for n in window.group(1).split("x")]
        dilations = [int(n) for n in dilate.group(1).split("x")] if dilate else [1] * len(sizes)
        spatial = [n for _, n in sorted((c, n) for n, c in zip(lhs[0][1], labels.group(1)) if c.isdigit())]
        contract *= math.prod(min(-(-n // d), x) for n, d, x in zip(sizes, dilations, spatial))
    groups = re.search(r"feature_group_count=(\d+)", instr.rest)
    return 2.0 * out_elems * contract / (int(groups.group(1)) if groups else 1)


def _operands(instr: _Instr) -> list[str]:
    return re.findall(r"%([\w.\-]+)", instr.rest.split("), ")[0])


def _param_reads(comp: list[_Instr], index: int, comps: dict[str, list[_Instr]], full: float) -> float:
    """Bytes a fused computation reads of its parameter `index`: the slices it takes when every use
    is a (dynamic-)slice, as in a loop body's layer of a stacked array, else all of it."""
    params = [i for i in comp if i.op == "parameter" and re.match(rf"{index}\)", i.rest)]
    return _value_reads(comp, params[0].name, comps, full) if params else full


def _value_reads(comp: list[_Instr], name: str, comps: dict[str, list[_Instr]], full: float) -> float:
    """Bytes the uses of value `name` in `comp` read of it (`_param_reads`): a slice or a gather
    reads what it takes (a decode step's embedding rows, not the table). A bitcast is a view
    and an in-place dynamic-update-slice or scatter leaves the buffer where it was: their uses are the value's
    (the CUDA compiler writes a decode step's KV-cache row through a bitcast to u16, then slices
    the layer it attends)."""
    total = 0.0
    for i in comp:
        ops = _operands(i)
        if name not in ops:
            continue
        if i.op in ("dynamic-slice", "slice", "gather") and ops[0] == name:
            total += _nbytes(i.shape)
        elif i.op == "bitcast" and i.root:  # the view leaves the computation: its readers are unseen here
            return full
        elif i.op == "bitcast" or (i.op in ("dynamic-update-slice", "scatter") and ops[0] == name):
            total += 0 if i.root else _value_reads(comp, i.name, comps, full)  # a root update: in place
        elif i.op == "fusion" and (called := _called(i.rest, "calls")):
            total += _param_reads(comps.get(called[0], []), ops.index(name), comps, full)
        else:
            return full
    return min(total, full)


def _traffic(instr: _Instr, shapes: dict[str, str], comps: dict[str, list[_Instr]]) -> float:
    """HBM bytes one top-level operation reads and writes. A fusion reads the slices it takes of a
    sliced operand; a dynamic-update-slice or a scatter (alone or as a fusion's root) writes its
    update in place (XLA shares the operand's buffer with either: the rollout engine's rows, each
    written at its own slot, are a scatter)."""
    operands = _operands(instr)
    sizes = [_nbytes(shapes.get(o, "")) for o in operands]
    written = _nbytes(instr.shape)
    if instr.op == "dynamic-update-slice" and len(sizes) > 1:
        return 2 * sizes[1] + sum(sizes[2:])
    if instr.op == "scatter" and len(sizes) > 2:  # (operand, indices, updates)
        return 2 * sizes[2] + sizes[1]
    if instr.op == "custom-call" and _is_ragged(instr):  # the layer it reads of each stack, not the stack
        return written + sum(size for o, size in zip(operands, sizes) if len(_dims(shapes, o)) != 5) + \
            _ragged_rows(instr, shapes)
    if instr.op == "fusion" and (called := _called(instr.rest, "calls")):
        comp = comps.get(called[0], [])
        sizes = [_param_reads(comp, k, comps, size) for k, size in enumerate(sizes)]
        root = next((i for i in comp if i.root), None)
        if root is not None and root.op in ("dynamic-update-slice", "scatter"):
            update = _operands(root)[1:2] if root.op == "dynamic-update-slice" else _operands(root)[2:3]
            inner = {i.name: i.shape for i in comp}
            written = _nbytes(inner.get(update[0], "")) if update else written
    return written + sum(sizes)


_CUDNN_ATTENTION = re.compile(r'custom_call_target="__cudnn\$fmha(\w*)"')


def _is_ragged(instr: _Instr) -> bool:
    return instr.name.startswith(ragged_attention.NAME)


def _dims(shapes: dict[str, str], name: str) -> tuple[int, ...]:
    arrays = _arrays(shapes.get(name, ""))
    return arrays[0][1] if len(arrays) == 1 else ()


def _ragged_rows(instr: _Instr, shapes: dict[str, str]) -> float:
    """Bytes of the cache rows the ragged kernel reads, every row whole: of each key/value stack
    operand [L, R, K, S, H] (the whole stack, one layer read), one layer. Once per call: exact
    where the new tokens fit one query block (ragged_attention.QUERY_BLOCK: a decode step, a
    prefill chunk of up to 256 tokens, as the 7B preset's); a longer T reads them once per block."""
    stacks = [o for o in _operands(instr) if len(_dims(shapes, o)) == 5]
    return sum(_nbytes(shapes[o]) / _dims(shapes, o)[0] for o in stacks)


def _ragged_flops(instr: _Instr, shapes: dict[str, str]) -> float:
    """The ragged kernel's two matmuls (q k^T, p v) over whole rows, from q [B, K, M, H] (M: its
    query rows, tokens x groups) and a stack's S."""
    ops = [_dims(shapes, o) for o in _operands(instr)]
    q = next((d for d in ops if len(d) == 4), None)
    stack = next((d for d in ops if len(d) == 5), None)
    return 2.0 * 2 * math.prod(q) * stack[3] if q and stack else 0.0


def _kernel_flops(instr: _Instr) -> float:
    """An attention kernel's matmul FLOPs, which XLA does not see, causal (half of the T x T
    scores), from q's shape (`kernel_q_shape`): splash's Pallas (Mosaic) kernels, forward (q k^T
    and p v), dq (three matmuls) and dkv (four); cuDNN's fused attention (custom calls
    `__cudnn$fmha...`), forward (two) and backward (five: the scores again, dp, dv, dq, dk)."""
    q = kernel_q_shape(instr)
    if q is None:
        return 0.0
    if cudnn := _CUDNN_ATTENTION.search(instr.rest):
        b, t, n, h = q  # cuDNN takes [B, T, N, H]
        mask = re.search(r'"mask_type":\s*"(\w+)"', instr.rest)
        keys = t / 2 if mask and "CAUSAL" in mask.group(1) else t
        return 2.0 * b * n * t * keys * h * (5 if "Backward" in cudnn.group(1) else 2)
    *lead, t, h = q
    matmuls = 3 if "_dq" in instr.name else 4 if "_dkv" in instr.name else 2
    return 2.0 * math.prod(lead) * (t * t / 2) * h * matmuls


def kernel_q_shape(instr: _Instr) -> tuple[int, ...] | None:
    """The query operand's shape of an attention kernel's custom call: the first floating-point
    operand of rank 3 or 4, splash's ([rows,] heads, T, H) (a vmap over one row leaves no row
    dimension), cuDNN's [B, T, N, H]."""
    if "splash" not in instr.name and "flash" not in instr.name and not _CUDNN_ATTENTION.search(instr.rest):
        return None
    at = instr.rest.find("operand_layout_constraints=")
    arrays = _arrays(instr.rest[at:] if at >= 0 else instr.rest)
    return next((d for t, d in arrays if t.startswith(("f", "bf")) and len(d) in (3, 4)), None)


def hlo_text(compiled: Any) -> str:
    """`compiled.as_text()`, without the C++ log lines of a module it cannot read back. jaxlib
    0.10.2 rejects some modules libtpu 0.0.52 builds (an async-update of 3 operands, jaxlib's XLA
    expects 1: a version skew of the two XLAs): its parser logs "RET_CHECK failure
    (.../hlo_instruction.cc:390) ... async-update" with an empty C++ stack trace on stderr before
    the JaxRuntimeError that the caller reports (no env var quiets it: TF_CPP_MIN_LOG_LEVEL,
    TPU_STDERR_LOG_LEVEL, TPU_MIN_LOG_LEVEL do not). What the C++ prints meanwhile is held back
    and printed after a success, dropped after that error."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to hold back
        return compiled.as_text()
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            text = compiled.as_text()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        printed = held.read()
    while printed:
        printed = printed[os.write(2, printed):]
    return text


@dataclasses.dataclass(frozen=True)
class _Work:
    """What a computation does each time it runs (program_cost): Cost's figures, by field name."""

    flops: float = 0.0
    kernel_flops: float = 0.0
    bytes: float = 0.0
    unknown_loops: int = 0
    ragged_bytes: float = 0.0  # of bytes, the ragged kernel's cache rows
    ragged_flops: float = 0.0  # of kernel, the ragged kernel's
    near_sync: float = 0.0
    near_async: float = 0.0
    far_sync: float = 0.0
    far_async: float = 0.0
    near_steps: float = 0.0
    far_steps: float = 0.0
    collectives: float = 0.0
    grid_steps: float = 0.0
    ops: float = 0.0

    def __add__(self, other: _Work) -> _Work:
        return _Work(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)})

    def times(self, n: float) -> _Work:
        return _Work(**{f.name: getattr(self, f.name) * (1 if f.name == "unknown_loops" else n)
                        for f in dataclasses.fields(self)})


def _grid_steps(instr: _Instr, shapes: dict[str, str]) -> float:
    """A Pallas kernel's grid steps: splash's forward, dq and dkv kernels ([rows x] heads x query
    blocks x key blocks, blocks of 512 where T is a multiple, else 128, every key block counted);
    the ragged kernel's (ragged_attention.grid_steps of its operand q [rows, kv heads, query rows,
    H]: a grid step per kv head and block of rows, looping over their key blocks inside)."""
    if _is_ragged(instr):
        q = next((d for d in (_dims(shapes, o) for o in _operands(instr)) if len(d) == 4), None)
        return float(ragged_attention.grid_steps(*q[:3])) if q else 0.0
    q = kernel_q_shape(instr)
    if q is None or _CUDNN_ATTENTION.search(instr.rest):
        return 0.0
    *lead, t, _ = q
    block = 512 if t % 512 == 0 else 128
    return float(math.prod(lead) * (-(-t // block)) ** 2) if lead else 0.0


def _collective_work(instr: _Instr, kind: str, shapes: dict[str, str], domains: Sequence[int] | None,
                     asynchronous: bool) -> _Work:
    """A collective's bytes per device and ring steps, by its link (planner.collectives)."""
    arrays = [_BYTES.get(t, 4) * math.prod(d) for t, d in _arrays(instr.shape)]
    out = max(arrays, default=0.0) if instr.op.endswith("-start") and kind != "all-reduce" else sum(arrays)
    c = collectives.collective(kind, out, sum(_nbytes(shapes.get(o, "")) for o in _operands(instr)), instr.rest,
                               domains, asynchronous or instr.op.endswith("-start"))
    side = "far" if c.far else "near"
    return _Work(**{f"{side}_{'async' if c.asynchronous else 'sync'}": c.bytes, f"{side}_steps": c.steps,
                    "collectives": 1.0})


def program_cost(compiled: Any, domains: Sequence[int] | None = None) -> Cost:
    """FLOPs and HBM bytes of a compiled program per device, from its optimized HLO, each operation
    weighted by how often it runs: a while loop's body by its trip count (XLA's own
    `cost_analysis()`, also returned, counts every loop body once, so a scan over 28 layers looks
    like one layer), a conditional by its most expensive branch (by FLOPs, then bytes: the worst
    case, as the planner's shapes are; the update's mini-batch loop is a conditional that skips
    padding rows). FLOPs: dots and convolutions (2 x output x contracted size), and for the attention
    kernels, which XLA does not see into (splash's Pallas kernels, cuDNN's fused attention, the
    ragged cached-attention kernel over whole rows), their matmuls by formula; elementwise work is
    left out (it is bandwidth, below). Bytes: what each top-level operation (a fusion, a matmul, a
    copy, a collective, a kernel) reads and writes (the ragged kernel: one layer of the key/value
    stacks it is given, every row whole, also counted apart as `Cost.ragged_bytes` and its FLOPs as
    `Cost.ragged_flops`, for `Cost.at_fill`), as XLA's cost model counts a fusion, so on-chip reuse
    inside a fusion is free and every fusion boundary is an HBM round trip. Besides: each
    collective's bytes and ring steps by link (`domains`: each device's ICI / NVLink domain, by the
    program's device ids; planner.collectives), the Pallas kernels' grid steps and the top-level
    operations run."""
    comps, entry = _computations(hlo_text(compiled))
    fused = {c for ins in comps.values() for i in ins if i.op == "fusion" for c in _called(i.rest, "calls")}
    in_async = {c for ins in comps.values() for i in ins if i.op == "async-start" for c in _called(i.rest, "calls")}

    @functools.cache
    def work(name: str) -> _Work:  # HLO's computations call each other without cycles
        shapes = {i.name: i.shape for i in comps.get(name, [])}
        total = _Work()
        for i in comps.get(name, []):
            if i.op in ("dot", "convolution"):
                total += _Work(flops=_dot_flops(i, shapes))
            elif i.op == "custom-call" and _is_ragged(i):
                k = _ragged_flops(i, shapes)
                total += _Work(flops=k, kernel_flops=k, ragged_bytes=_ragged_rows(i, shapes), ragged_flops=k,
                               grid_steps=_grid_steps(i, shapes))
            elif i.op == "custom-call":
                k = _kernel_flops(i)
                total += _Work(flops=k, kernel_flops=k, grid_steps=_grid_steps(i, shapes))
            elif kind := collectives.kind_of(i.op):
                total += _collective_work(i, kind, shapes, domains, name in in_async)
            if name not in fused and i.op not in _FREE:
                total += _Work(bytes=_traffic(i, shapes, comps), ops=1.0)
            if i.op == "while":
                (body,), (cond,) = _called(i.rest, "body"), _called(i.rest, "condition")
                known = re.search(r'"known_trip_count":\{"n":"(\d+)"', i.rest)  # the compiler's own count
                n = int(known.group(1)) if known else _trip_count(comps.get(cond, []), comps)
                total += work(body).times(n or 1) + work(cond).times((n or 1) + 1) + _Work(unknown_loops=int(n is None))
            elif i.op == "fusion":
                total = sum((work(c) for c in _called(i.rest, "calls")), total)
            elif i.op in ("call", "async-start", "custom-call"):
                total = sum((work(c) for c in _called(i.rest, "calls") + _called(i.rest, "to_apply")), total)
            elif i.op == "conditional":
                branches = _called(i.rest, "branch_computations") or (
                    _called(i.rest, "true_computation") + _called(i.rest, "false_computation"))
                total += max((work(c) for c in branches), key=lambda w: (w.flops, w.bytes), default=_Work())
        return total

    program = work(entry)
    xla = compiled.cost_analysis() or {}
    if isinstance(xla, Sequence):
        xla = xla[0] if xla else {}
    figures = {f.name: getattr(program, f.name) for f in dataclasses.fields(program)}
    return Cost(xla_flops=float(xla.get("flops", 0.0)), xla_bytes=float(xla.get("bytes accessed", 0.0)), **figures)

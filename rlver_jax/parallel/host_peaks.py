"""This host's CPU as the planner's chip (launch/plan.py without --topology or --gpu): its figures
measured by a short microbenchmark on its own devices, as XLA:CPU runs programs, and cached.

  peak FLOP/s   the best of a few [1024, 1024] x [1024, 1024] matmuls in the run's compute dtype
  bandwidth     the best of a few streaming fusions a * b + c over 16M-element arrays (bytes read
                and written per second): memory's rate, beyond the last-level cache
  per operation the fixed cost of one operation a program runs: a loop of small operations, its
                time over the operations the planner counts in it (hlo_cost.program_cost)
  per call      a program call from the host and the wait for its result, with nothing to compute

Each is the best (the fastest) of its repeats: what the host gives when the program has the cores.
The cache (~/.cache/rlver_jax/host_peaks.json) is keyed by the CPU, its core count, the device
count, the dtype and jax's version; `fresh` measures again (the figures move with the host's load).
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rlver_jax.parallel.chips import Chip

CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "rlver_jax" / "host_peaks.json"
REPEATS = 10


def _best(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    """The fastest of `repeats` runs of `fn` (after one to compile and warm), in seconds."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                        platform.processor())
    except OSError:
        return platform.processor() or platform.machine()


def _stream(elements: int) -> float:
    """Bytes per second of a * b + c over arrays of `elements` floats (three read, one written)."""
    x = jnp.ones((elements,), jnp.float32)
    fn = jax.jit(lambda p, q, r: p * q + r)
    return 4 * x.nbytes / _best(lambda: fn(x, x, x))


def _op_seconds(count_ops: Callable[[object], float]) -> float:
    """The fixed cost of one operation: a loop of 200 iterations of a few small operations that
    XLA cannot fuse (a matmul, a reduction, a scatter), over the operations `count_ops` counts."""

    def body(_, x):
        y = jnp.dot(x, x.T)[:, :16]
        x = x.at[0].add(jnp.sum(y))
        return jnp.tanh(x) + jnp.max(y)

    fn = jax.jit(lambda x: jax.lax.fori_loop(0, 200, body, x))
    x = jnp.ones((16, 16), jnp.float32)
    compiled = fn.lower(x).compile()
    return _best(lambda: compiled(x)) / max(count_ops(compiled), 1.0)


def measure(dtype: str, count_ops: Callable[[object], float], fresh: bool = False) -> Chip:
    """This host's CPU as a Chip (module docstring) for programs computing in `dtype` ("float32",
    "bfloat16"); `count_ops(compiled)`: the operations the planner counts in a compiled program."""
    key = f"{_cpu_name()}|{os.cpu_count()}|{jax.device_count()}|{dtype}|jax {jax.__version__}"
    cached = {}
    if CACHE.exists():
        try:
            cached = json.loads(CACHE.read_text())
        except ValueError:
            cached = {}
    if not fresh and key in cached:
        return Chip(**cached[key])
    n = 1024
    a = jnp.ones((n, n), dtype)
    mm = jax.jit(lambda x: x @ x)
    flops = 2 * n ** 3 / _best(lambda: mm(a))
    bandwidth = _stream(16 * 2 ** 20)
    tiny = jnp.ones((4,), jnp.float32)
    call = jax.jit(lambda p: p)
    row = dict(name="cpu", device_kind=f"{_cpu_name()} ({os.cpu_count()} cores)", bf16_tflops=flops / 1e12,
               hbm_gb_s=bandwidth / 1e9, hbm_gb=16.0, op_us=_op_seconds(count_ops) * 1e6,
               call_us=_best(lambda: call(tiny), 20) * 1e6,
               measured=f"measured {time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.1f}")
    cached[key] = row
    try:
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        CACHE.write_text(json.dumps(cached, indent=1))
    except OSError:  # a read-only home: measured again next time
        pass
    return Chip(**row)

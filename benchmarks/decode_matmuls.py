r"""The matmuls of one 0.5B decode step, each alone: how fast each streams its weight (issue 17).

  PYTHONPATH=. .venv/bin/python benchmarks/decode_matmuls.py
  PYTHONPATH=. .venv/bin/python benchmarks/decode_matmuls.py --rows=8 --dtypes=float32

Each row jits one matmul at the model's shapes (Qwen2.5-0.5B: hidden 896, MLP 4864, 2 KV heads
of 64, vocabulary 151,936) with `preferred_element_type=float32` as models/qwen2.py computes
them, and prints its best-of-`--repeats` time and weight bytes / time. The LM head rows compare
the forms of the tied head: the embedding table [V, D] contracted over D (what the model does),
a transposed [D, V] copy, and the table cut into vocabulary blocks. Beside them, the machine's
streaming read bandwidth (benchmarks/measure.py). Compare rows within one run.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks.measure import best_of, stream_bandwidth  # noqa: E402
from rlver_jax.models.config import get_preset  # noqa: E402

_ROWS = flags.DEFINE_list("rows", ["8", "32"], "Batch rows of the decode step.")
_DTYPES = flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "Weight and compute dtypes.")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed calls per matmul (the best is kept).")
_BLOCKS = 8  # vocabulary blocks of the blocked head


def _dot(x, w):
    return jnp.dot(x, w, preferred_element_type=jnp.float32)


def _head(x, table):  # the model's tied head: contract the table's D axis where it lies
    return jax.lax.dot_general(x, table, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _blocked_head(x, table):
    blocks = table.reshape(_BLOCKS, -1, table.shape[1])
    return jnp.einsum("md,cvd->mcv", x, blocks, preferred_element_type=jnp.float32).reshape(x.shape[0], -1)


def main(argv):
    del argv
    cfg = get_preset("qwen2.5-0.5b")
    d, f, v, kv = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_kv_heads * cfg.head_dim
    # (name, function, weight shape): every matmul a decode step runs, and the head's other forms.
    cases = [("q / o projection", _dot, (d, d)), ("k / v projection", _dot, (d, kv)),
             ("MLP gate / up", _dot, (d, f)), ("MLP down", _dot, (f, d)),
             ("LM head [V, D] (tied, the model's form)", _head, (v, d)),
             ("LM head, transposed copy [D, V]", _dot, (d, v)),
             (f"LM head, {_BLOCKS} vocabulary blocks", _blocked_head, (v, d))]
    print(f"jax {jax.__version__}; streaming read {stream_bandwidth() / 1e9:.1f} GB/s\n")
    print("| dtype | rows | matmul | weight MB | ms | GB/s |\n|---|---:|---|---:|---:|---:|")
    for dtype in map(jnp.dtype, _DTYPES.value):
        for rows in map(int, _ROWS.value):
            for name, fn, shape in cases:
                w = jnp.ones(shape, dtype)
                xin = jnp.ones((rows, shape[0] if fn is _dot else shape[1]), dtype)
                call = jax.jit(fn)
                call(xin, w).block_until_ready()  # compile
                s = best_of(lambda: call(xin, w).block_until_ready(), _REPEATS.value)
                print(f"| {dtype.name} | {rows} | {name} | {w.nbytes / 1e6:,.1f} | {s * 1e3:.2f} | "
                      f"{w.nbytes / s / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    app.run(main)

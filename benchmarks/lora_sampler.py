r"""The sampler's two ways to apply LoRA adapters, measured at one decoder layer (issue 28).

  PYTHONPATH=. .venv/bin/python benchmarks/lora_sampler.py
  PYTHONPATH=. .venv/bin/python benchmarks/lora_sampler.py --preset=qwen2.5-0.5b --rows=8,64

Merged: once per train step the adapters are folded into the sampling copy (W + scale * A @ B per
adapted kernel, `lora.merge`, what the trainer does), and every decode step runs the plain
projections. Unmerged: every decode step runs x @ W + scale * (x @ A) @ B at each of the seven
projections. Everything else in a decode step (attention, norms, the LM head, sampling) is the
same in both, so one layer's projections and one layer's merge measure the whole difference.
Prints, per row count: the layer's projections merged and unmerged (best of --repeats, fp32 as
XLA:CPU computes fast; models/qwen2._dense; the two forms' outputs are checked equal), the
unmerged overhead, the merge, and the number of decode steps after which merging has paid for
itself. Compare rows within one run.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks.measure import best_of  # noqa: E402
from rlver_jax.models import lora, qwen2  # noqa: E402
from rlver_jax.models.config import get_preset  # noqa: E402

_PRESET = flags.DEFINE_string("preset", "qwen2.5-7b", "Model shapes (models/config.py presets).")
_RANK = flags.DEFINE_integer("rank", 64, "Adapter rank.")
_ROWS = flags.DEFINE_list("rows", ["8", "32", "128"], "Token rows of a decode step (the sampler's batch).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls per case (the best is kept).")


def _projections(layer: dict, x: jax.Array, adapters: dict | None, scale: float) -> tuple[jax.Array, ...]:
    """One layer's seven projections of x [M, D] (attention mixing and the MLP nonlinearity left out:
    they are the same either way); with `adapters` the low-rank path is added unmerged. Every
    projection is among the outputs, so XLA computes each."""
    def dense(inp, module, kernel, in_dims=1):
        y = qwen2._dense(inp, layer[module][kernel], in_dims)
        if adapters is None:
            return y
        ad = adapters[module][kernel]
        low = qwen2._dense(qwen2._dense(inp, ad["lora_a"], in_dims), ad["lora_b"])
        return y + scale * low

    q = dense(x, "attn", "q_kernel")
    k, v = dense(x, "attn", "k_kernel"), dense(x, "attn", "v_kernel")
    o = dense(q, "attn", "o_kernel", in_dims=2)
    gated = dense(x, "mlp", "gate_kernel") * dense(x, "mlp", "up_kernel")
    return o, k, v, dense(gated, "mlp", "down_kernel")


def main(argv):
    del argv
    cfg = get_preset(_PRESET.value).replace(num_layers=1, scan_layers=False, param_dtype="float32")
    settings = lora.LoraSettings(rank=_RANK.value)
    keys = iter(jax.random.split(jax.random.key(0), 64))
    base = jax.tree.map(lambda s: 0.02 * jax.random.normal(next(keys), s.shape, s.dtype), qwen2.abstract_params(cfg))
    adapters = jax.tree.map(lambda x: x + 0.01 * jax.random.normal(next(keys), x.shape),
                            lora.init_adapters(settings, base, jax.random.key(1)))
    layer, layer_ad = base["layer_0"], adapters["layer_0"]

    merge = jax.jit(lambda b, a: lora.merge(settings, b, a)["layer_0"])
    merged_layer = merge(base, adapters)
    t_merge = best_of(lambda: jax.block_until_ready(merge(base, adapters)), _REPEATS.value)
    plain = jax.jit(lambda w, x: _projections(w, x, None, settings.scale))
    unmerged = jax.jit(lambda w, a, x: _projections(w, x, a, settings.scale))

    print(f"jax {jax.__version__}; {_PRESET.value} shapes, one layer (hidden {cfg.hidden_size}, MLP "
          f"{cfg.intermediate_size}), LoRA rank {settings.rank} on all seven projections, fp32\n")
    print(f"merge of the layer's adapters (W + scale * A @ B, once per train step): {t_merge * 1e3:.1f} ms\n")
    print("| rows | merged ms | unmerged ms | unmerged overhead | decode steps to repay the merge |")
    print("|---:|---:|---:|---:|---:|")
    for rows in map(int, _ROWS.value):
        x = jax.random.normal(next(keys), (rows, cfg.hidden_size), jnp.float32)
        t_plain = best_of(lambda: jax.block_until_ready(plain(merged_layer, x)), _REPEATS.value)
        t_unmerged = best_of(lambda: jax.block_until_ready(unmerged(layer, layer_ad, x)), _REPEATS.value)
        got, want = unmerged(layer, layer_ad, x), plain(merged_layer, x)  # the two forms compute one thing
        err = max(float(jnp.abs(g - w).max() / jnp.abs(w).max()) for g, w in zip(got, want))
        if err > 1e-4:
            raise SystemExit(f"unmerged and merged projections differ by {err:.2e} (relative): a bug in one form")
        extra = t_unmerged - t_plain
        repay = f"{t_merge / extra:.0f}" if extra > 0 else "never (no overhead measured)"
        print(f"| {rows} | {t_plain * 1e3:.2f} | {t_unmerged * 1e3:.2f} | {100 * extra / t_plain:+.1f}% | {repay} |")


if __name__ == "__main__":
    app.run(main)

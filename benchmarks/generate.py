r"""Generation benchmark (issue 4): rlver_jax.sampling.generation.generate vs transformers' generate, same run.

  .venv/bin/python benchmarks/generate.py                                  # tiny and 0.5B, fp32 and bf16
  .venv/bin/python benchmarks/generate.py --presets=tiny --batches=8       # seconds

For each preset, random weights are drawn once (our init), written as a Hugging Face directory
and loaded by both sides, so both run the same model. Each row is one (preset, dtype, batch):
a left-padded batch of random prompts (lengths prompt_len/2 .. prompt_len), sampling at
temperature 1 with no truncation (the RLVER policy setting) and no stop ids, so both sides make
exactly `new_tokens` tokens per row (transformers also gets min_new_tokens).

  tok/s: batch x new_tokens / wall time of the whole call (prefill included), best of --repeats
    after a warm-up call (which compiles ours).
  decode ms/step: (t(new_tokens) - t(prefill)) / (new_tokens - 1), the cost of one decode step
    (benchmarks/measure.py: time_ours, time_transformers).
  MFU: model FLOPs (2 x matmul parameters per token, plus attention over the real context) of
    the whole call / wall / the measured matmul peak of this machine in the run's dtype.
  weight-read bound: parameter bytes / measured streaming bandwidth, the least one decode step
    can cost when memory-bound.
  KV/seq: KV-cache bytes per sequence of ours, (bucketed prompt + new_tokens) slots.
  load: the 1-minute load average after the row (a shared host: compare sides within a row).
"""

import dataclasses
import functools
import os
import pathlib
import sys
import tempfile
from collections.abc import Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks.measure import (  # noqa: E402
    best_of,
    generation_flops,
    matmul_params,
    matmul_peak,
    random_prompts,
    stream_bandwidth,
    time_ours,
    time_transformers,
)
from rlver_jax.models import hf_io, qwen2, smollm2  # noqa: E402
from rlver_jax.models.config import get_preset  # noqa: E402
from rlver_jax.sampling import generation  # noqa: E402

_ARCH = {"smol": "smollm2-135m"}  # --presets names with real weights: their architecture

_PRESETS = flags.DEFINE_list("presets", ["tiny", "qwen2.5-0.5b"], "Model presets (random weights); smol: the "
                             "real SmolLM2-135M-Instruct of launch/fetch_smollm2.py.")
_BATCHES = flags.DEFINE_list("batches", ["8", "32"], "Batch sizes.")
_DTYPES = flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "Parameter and compute dtypes.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 128, "New tokens per row.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 32, "Longest prompt; rows have half to all of it.")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Timed calls per row (best is kept).")
_SEED = flags.DEFINE_integer("seed", 0, "Weights, prompts and sampling seed.")
_PROFILE = flags.DEFINE_string("profile_dir", "", "Also write a jax.profiler trace of one more call of ours "
                               "per row to DIR/PRESET-DTYPE-BATCH (open *.trace.json.gz in Perfetto).")


@dataclasses.dataclass
class Row:
    preset: str
    dtype: str
    batch: int
    ours_s: float
    ours_step_ms: float
    hf_s: float
    hf_step_ms: float
    flops: float
    kv_bytes: int
    load: float  # 1-minute load average after both sides ran


def gemm_stream(dtype, rows: int = 8) -> float:
    """Weight bytes/s of XLA's matmul at `rows` rows: a chain of x @ W over 1 GiB of fp32-sized
    weights (MLP-shaped, [1024, 4096] and back), as one decode step streams its weights."""
    ws = [jnp.full((1024, 4096) if i % 2 == 0 else (4096, 1024), 0.01, dtype) for i in range(64)]
    x = jnp.ones((rows, 1024), dtype)

    @jax.jit
    def chain(ws, x):
        for w in ws:
            x = jnp.dot(x, w, preferred_element_type=jnp.float32).astype(dtype)
        return x

    chain(ws, x).block_until_ready()
    return sum(w.nbytes for w in ws) / best_of(lambda: chain(ws, x).block_until_ready(), 3)


def bench_preset(preset: str, rng: np.random.Generator, report: Callable[[Row], None]) -> None:
    if preset == "smol":  # real weights: both sides read the same directory
        base, params32 = hf_io.load_pretrained(smollm2.DEFAULT_DIR)
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(smollm2.DEFAULT_DIR, dtype=torch.float32).eval()
    else:
        base = get_preset(preset)
        params32 = qwen2.init_params(base, jax.random.key(_SEED.value))
        with tempfile.TemporaryDirectory() as tmp:
            path = hf_io.save_pretrained(base, params32, pathlib.Path(tmp) / preset)
            hf_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    n = _NEW_TOKENS.value
    for dtype in _DTYPES.value:
        # Both sides hold the same weights in `dtype` (cast from the same fp32 draw).
        config = base.replace(param_dtype=dtype, dtype=dtype)
        params = jax.tree.map(functools.partial(jnp.asarray, dtype=config.jnp_param_dtype), params32)
        hf_model.to(torch.float32 if dtype == "float32" else torch.bfloat16)
        for batch in (int(b) for b in _BATCHES.value):
            ids, mask = random_prompts(config.vocab_size, batch, _PROMPT_LEN.value, rng)
            ours = time_ours(config, params, ids, mask, n, _REPEATS.value, _SEED.value)
            if _PROFILE.value:
                with jax.profiler.trace(str(pathlib.Path(_PROFILE.value) / f"{preset}-{dtype}-{batch}"),
                                        create_perfetto_trace=True):
                    time_ours(config, params, ids, mask, n, 1, _SEED.value)
            hf = time_transformers(hf_model, ids, mask, n, _REPEATS.value)
            report(Row(preset, dtype, batch, *ours, *hf, generation_flops(config, mask.sum(1), n),
                       generation.kv_cache_bytes(config, ids.shape[1], n), os.getloadavg()[0]))
        del params
        jax.clear_caches()  # the compiled programs of this dtype


def main(argv):
    del argv
    torch.manual_seed(_SEED.value)
    rng = np.random.default_rng(_SEED.value)
    peaks = {d: matmul_peak(jnp.dtype(d)) for d in _DTYPES.value}
    bandwidth = stream_bandwidth()
    gemm = {d: gemm_stream(jnp.dtype(d)) for d in _DTYPES.value}
    n = _NEW_TOKENS.value
    print(f"jax {jax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"transformers {transformers.__version__}, {jax.devices()[0].device_kind}")
    print("matmul peak: " + ", ".join(f"{d} {p / 1e9:.0f} GFLOP/s" for d, p in peaks.items())
          + f"; streaming read {bandwidth / 1e9:.1f} GB/s; matmul weight streaming at 8 rows: "
          + ", ".join(f"{d} {g / 1e9:.1f} GB/s" for d, g in gemm.items()))
    print(f"\n{n} new tokens per row, prompts of {_PROMPT_LEN.value // 2}-{_PROMPT_LEN.value} tokens\n")
    print("| model | dtype | batch | ours tok/s | transformers tok/s | speed-up | ours decode ms/step "
          "| transformers decode ms/step | decode speed-up | weight-read bound ms/step | ours MFU | transformers MFU "
          "| KV/seq | load |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)

    def report(r: Row) -> None:  # a row as soon as it is measured: a long run that dies keeps its rows
        bound_ms = (matmul_params(get_preset(_ARCH.get(r.preset, r.preset))) * jnp.dtype(r.dtype).itemsize
                    / bandwidth * 1e3)
        peak = peaks[r.dtype]
        print(f"| {r.preset} | {r.dtype} | {r.batch} | {r.batch * n / r.ours_s:.1f} | {r.batch * n / r.hf_s:.1f} "
              f"| {r.hf_s / r.ours_s:.2f}x | {r.ours_step_ms:.1f} | {r.hf_step_ms:.1f} "
              f"| {r.hf_step_ms / r.ours_step_ms:.2f}x "
              f"| {bound_ms:.1f} | {r.flops / r.ours_s / peak:.1%} | {r.flops / r.hf_s / peak:.1%} "
              f"| {r.kv_bytes / 2**20:.2f} MiB | {r.load:.1f} |", flush=True)

    for preset in _PRESETS.value:
        bench_preset(preset, rng, report)


if __name__ == "__main__":
    app.run(main)

r"""Generation benchmark (issue 4): rlver_jax.sampling.generate vs transformers' generate, same run.

  .venv/bin/python benchmarks/generate.py                                  # tiny and 0.5B, fp32 and bf16
  .venv/bin/python benchmarks/generate.py --presets=tiny --batches=8       # seconds

For each preset, random weights are drawn once (our init), written as a Hugging Face directory
and loaded by both sides, so both run the same model. Each row is one (preset, dtype, batch):
a left-padded batch of random prompts (lengths prompt_len/2 .. prompt_len), sampling at
temperature 1 with no truncation (the RLVER policy setting) and no stop ids, so both sides make
exactly `new_tokens` tokens per row (transformers also gets min_new_tokens).

  tok/s: batch x new_tokens / wall time of the whole call (prefill included), best of --repeats
    after a warm-up call (which compiles ours).
  decode ms/step: (t(new_tokens) - t(1)) / (new_tokens - 1), the cost of one decode step.
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

from benchmarks.measure import best_of, matmul_params, matmul_peak  # noqa: E402
from rlver_jax import sampling  # noqa: E402
from rlver_jax.models import hf_io, qwen2  # noqa: E402
from rlver_jax.models.config import Qwen2Config, get_preset  # noqa: E402

_PRESETS = flags.DEFINE_list("presets", ["tiny", "qwen2.5-0.5b"], "Model presets (random weights).")
_BATCHES = flags.DEFINE_list("batches", ["8", "32"], "Batch sizes.")
_DTYPES = flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "Parameter and compute dtypes.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 128, "New tokens per row.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 32, "Longest prompt; rows have half to all of it.")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Timed calls per row (best is kept).")
_SEED = flags.DEFINE_integer("seed", 0, "Weights, prompts and sampling seed.")


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


def stream_bandwidth() -> float:
    """Bytes/s of reading a 1 GiB array once (a sum): the memory roofline of a decode step."""
    x = jnp.ones((256 * 1024**2,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    return x.nbytes / best_of(lambda: total(x).block_until_ready(), 3)


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


def model_flops(config: Qwen2Config, prompt_lengths: np.ndarray, new_tokens: int) -> float:
    """Useful FLOPs of generating `new_tokens` after each prompt: matmuls plus causal attention."""
    # The last new token is never fed back: each row processes prompt + new_tokens - 1 tokens.
    processed = prompt_lengths + new_tokens - 1
    attn_per_ctx = 4 * config.num_layers * config.num_heads * config.head_dim  # QK^T and PV per slot
    context_sum = processed * (processed + 1) / 2  # token t attends to t + 1 slots
    return float(np.sum(2 * matmul_params(config) * processed + attn_per_ctx * context_sum))


def prompts(config: Qwen2Config, batch: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    t = _PROMPT_LEN.value
    lengths = rng.integers(t // 2, t + 1, batch)
    ids = np.zeros((batch, t), np.int64)
    mask = np.zeros((batch, t), np.int64)
    for b, n in enumerate(lengths):
        ids[b, t - n:] = rng.integers(1, config.vocab_size, n)
        mask[b, t - n:] = 1
    return ids, mask


def run_ours(config, params, ids, mask, new_tokens: int, key) -> Callable[[], None]:
    def call():
        out = sampling.generate(config, params, ids, mask, max_new_tokens=new_tokens, rng=key,
                                temperature=1.0, top_p=1.0, top_k=0, stop_ids=())
        assert int(out.lengths.min()) == new_tokens
    return call


def run_hf(model, ids, mask, new_tokens: int) -> Callable[[], None]:
    ids_t, mask_t = torch.tensor(ids), torch.tensor(mask)

    def call():
        with torch.no_grad():
            out = model.generate(input_ids=ids_t, attention_mask=mask_t, do_sample=True, temperature=1.0,
                                 top_p=1.0, top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 pad_token_id=0)
        assert out.shape[1] == ids.shape[1] + new_tokens
    return call


def time_calls(full: Callable[[], None], one: Callable[[], None], warm_up: Callable[[], None]) -> tuple[float, float]:
    """(seconds of the full call, decode ms per step), after a warm-up call and a one-token call."""
    warm_up()
    one()
    t_full, t_one = best_of(full, _REPEATS.value), best_of(one, _REPEATS.value)
    return t_full, (t_full - t_one) / (_NEW_TOKENS.value - 1) * 1e3


def bench_preset(preset: str, rng: np.random.Generator) -> list[Row]:
    rows = []
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
            ids, mask = prompts(config, batch, rng)
            key = jax.random.key(_SEED.value)
            ours_full = run_ours(config, params, ids, mask, n, key)
            ours = time_calls(ours_full, run_ours(config, params, ids, mask, 1, key), warm_up=ours_full)  # compiles
            print(f"  {preset} {dtype} batch {batch} ours: {batch * n / ours[0]:.1f} tok/s", flush=True)
            hf = time_calls(run_hf(hf_model, ids, mask, n), run_hf(hf_model, ids, mask, 1),
                            warm_up=run_hf(hf_model, ids, mask, 2))
            print(f"  {preset} {dtype} batch {batch} transformers: {batch * n / hf[0]:.1f} tok/s", flush=True)
            rows.append(Row(preset, dtype, batch, *ours, *hf, model_flops(config, mask.sum(1), n),
                            sampling.kv_cache_bytes(config, ids.shape[1], n), os.getloadavg()[0]))
    return rows


def main(argv):
    del argv
    torch.manual_seed(_SEED.value)
    rng = np.random.default_rng(_SEED.value)
    peaks = {d: matmul_peak(jnp.dtype(d)) for d in _DTYPES.value}
    bandwidth = stream_bandwidth()
    gemm = {d: gemm_stream(jnp.dtype(d)) for d in _DTYPES.value}
    print(f"jax {jax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"transformers {transformers.__version__}, {jax.devices()[0].device_kind}")
    print("matmul peak: " + ", ".join(f"{d} {p / 1e9:.0f} GFLOP/s" for d, p in peaks.items())
          + f"; streaming read {bandwidth / 1e9:.1f} GB/s; matmul weight streaming at 8 rows: "
          + ", ".join(f"{d} {g / 1e9:.1f} GB/s" for d, g in gemm.items()))
    rows = [row for preset in _PRESETS.value for row in bench_preset(preset, rng)]
    n = _NEW_TOKENS.value
    print(f"\n{n} new tokens per row, prompts of {_PROMPT_LEN.value // 2}-{_PROMPT_LEN.value} tokens\n")
    print("| model | dtype | batch | ours tok/s | transformers tok/s | speed-up | ours decode ms/step "
          "| transformers decode ms/step | decode speed-up | weight-read bound ms/step | ours MFU | transformers MFU "
          "| KV/seq | load |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        config = get_preset(r.preset)
        bound_ms = matmul_params(config) * jnp.dtype(r.dtype).itemsize / bandwidth * 1e3
        peak = peaks[r.dtype]
        print(f"| {r.preset} | {r.dtype} | {r.batch} | {r.batch * n / r.ours_s:.1f} | {r.batch * n / r.hf_s:.1f} "
              f"| {r.hf_s / r.ours_s:.2f}x | {r.ours_step_ms:.1f} | {r.hf_step_ms:.1f} | {r.hf_step_ms / r.ours_step_ms:.2f}x "
              f"| {bound_ms:.1f} | {r.flops / r.ours_s / peak:.1%} | {r.flops / r.hf_s / peak:.1%} "
              f"| {r.kv_bytes / 2**20:.2f} MiB | {r.load:.1f} |")


if __name__ == "__main__":
    app.run(main)

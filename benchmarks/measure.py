"""Measurements the benchmarks share: wall time of a call, this machine's matmul peak and read
bandwidth, the parameters a token meets in a matmul (the FLOP counts' main term), and timed
generation by both sides (ours and transformers') on the same prompts."""

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlver_jax.models.config import Qwen2Config
from rlver_jax.sampling import generation


def best_of(fn: Callable[[], None], repeats: int) -> float:
    """Least wall seconds of `repeats` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def matmul_peak(dtype, repeats: int = 3) -> float:
    """FLOP/s of a 4096x4096 jnp.dot in `dtype` (fp32 accumulation), best of `repeats`."""
    n = 4096
    a = jnp.ones((n, n), dtype)
    dot = jax.jit(lambda a: jnp.dot(a, a, preferred_element_type=jnp.float32))
    dot(a).block_until_ready()
    return 2 * n**3 / best_of(lambda: dot(a).block_until_ready(), repeats)


def stream_bandwidth() -> float:
    """Bytes/s of reading a 1 GiB array once (a sum): the memory roofline of a decode step."""
    x = jnp.ones((256 * 1024**2,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    return x.nbytes / best_of(lambda: total(x).block_until_ready(), 3)


def matmul_params(config: Qwen2Config) -> int:
    """Parameters a token meets in a matmul: all but the embedding table, plus the LM head."""
    embed = config.vocab_size * config.hidden_size
    return config.num_params() - (0 if config.tie_word_embeddings else embed)


def kv_bytes_per_token(config: Qwen2Config, itemsize: int) -> int:
    """Bytes of keys and values one token holds in a KV cache (all layers)."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize


def generation_flops(config: Qwen2Config, prompt_lengths: np.ndarray, new_tokens: int) -> float:
    """Useful FLOPs of generating `new_tokens` after each prompt: matmuls plus causal attention."""
    # The last new token is never fed back: each row processes prompt + new_tokens - 1 tokens.
    processed = prompt_lengths + new_tokens - 1
    attn_per_ctx = 4 * config.num_layers * config.num_heads * config.head_dim  # QK^T and PV per slot
    context_sum = processed * (processed + 1) / 2  # token t attends to t + 1 slots
    return float(np.sum(2 * matmul_params(config) * processed + attn_per_ctx * context_sum))


def random_prompts(vocab_size: int, batch: int, prompt_len: int, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray]:
    """A left-padded batch of random prompts of prompt_len/2 .. prompt_len tokens: ids, mask."""
    lengths = rng.integers(prompt_len // 2, prompt_len + 1, batch)
    ids = np.zeros((batch, prompt_len), np.int64)
    mask = np.zeros((batch, prompt_len), np.int64)
    for b, n in enumerate(lengths):
        ids[b, prompt_len - n:] = rng.integers(1, vocab_size, n)
        mask[b, prompt_len - n:] = 1
    return ids, mask


def time_ours(config: Qwen2Config, params, ids: np.ndarray, mask: np.ndarray, new_tokens: int,
              repeats: int, seed: int = 0) -> tuple[float, float]:
    """(seconds of a whole `generation.generate` call, decode ms per step).

    Sampling at temperature 1, no truncation, no stop ids: every row makes `new_tokens` tokens.
    decode ms/step = (t(call) - t(prefill-only call)) / (new_tokens - 1); the prefill-only call
    is the same program on a fully masked batch (every row starts done, so the decode loop never
    runs, while the prefill does the same work): one compilation, done by a first prefill-only call.
    """
    key = jax.random.key(seed)

    def call(mask_, expected):
        def run():
            out = generation.generate(config, params, ids, mask_, max_new_tokens=new_tokens, rng=key,
                                    temperature=1.0, top_p=1.0, top_k=0, stop_ids=())
            assert int(out.lengths.min()) == int(out.lengths.max()) == expected  # also waits for it
        return run

    full, prefill = call(mask, new_tokens), call(np.zeros_like(mask), 0)
    prefill()  # compiles
    t_full, t_prefill = best_of(full, repeats), best_of(prefill, repeats)
    return t_full, (t_full - t_prefill) / (new_tokens - 1) * 1e3


def time_transformers(model, ids: np.ndarray, mask: np.ndarray, new_tokens: int, repeats: int
                      ) -> tuple[float, float]:
    """The same for transformers' `generate` (sampling, min_new_tokens = max_new_tokens) on the
    model's device: decode ms/step = (t(new_tokens) - t(1)) / (new_tokens - 1)."""
    import torch  # only the benchmarks that compare with transformers need it

    ids_t, mask_t = torch.tensor(ids).to(model.device), torch.tensor(mask).to(model.device)

    def call(n):
        def run():
            with torch.no_grad():
                out = model.generate(input_ids=ids_t, attention_mask=mask_t, do_sample=True, temperature=1.0,
                                     top_p=1.0, top_k=0, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
            assert out.shape[1] == ids.shape[1] + n
            if out.is_cuda:
                torch.cuda.synchronize()
        return run

    call(2)()  # warm-up
    t_full, t_one = best_of(call(new_tokens), repeats), best_of(call(1), repeats)
    return t_full, (t_full - t_one) / (new_tokens - 1) * 1e3

r"""One-shot GPU suite (issue 17): what a short GPU lease should measure, in one command.

  python3 benchmarks/gpu_suite.py --out=$OUT/suite                          # one H200, ~8 min at most
  .venv/bin/python benchmarks/gpu_suite.py --smoke --out=/tmp/suite         # tiny shapes on CPU (CI)

Writes OUT/gpu_suite.json (every number, with the environment) and OUT/gpu_suite.md (the tables)
after each part, so a run cut short still leaves what it measured. The exact device command
(with the wheels the GPU image lacks) is in docs/benchmarks.md, "GPU suite".

  train: our policy update and a PyTorch step of transformers' Qwen2 on the same batch, with
    benchmarks/train_step.py's pieces (`run_ours`: GRPO, the LM head at policy tokens only;
    `run_torch`: autocast), bf16 compute on fp32 master weights, one --runs entry each (that
    file's flags --runs, --steps, --dtype, --remat, --scan_layers, --micro_batch_size, --seed,
    --peak_tflops, --torch_threads apply). MFU = train_step.step_flops / step seconds / --peak_tflops (the
    datasheet's dense bf16 rate; 0: a measured 4096^2 matmul). A run whose fp32 weights, gradients
    and AdamW moments (16 bytes a parameter) pass 85% of the device's memory is skipped, saying so.
  decode: `sampling.generate` and transformers' `generate` (sampling at temperature 1, every row
    --new_tokens tokens) on random bf16 models of each --decode_presets shape (transformers'
    weights are its own random init: same shapes, same work), at each --decode_batches, prompts
    of prompt_len/2 .. prompt_len tokens; decode ms/step by benchmarks/measure.py (time_ours,
    time_transformers). Roofline ms/step = (bf16 matmul weight bytes + the KV bytes of the real
    context, averaged over the decode steps) / --hbm_tbps; "of roofline" = roofline / measured.
    One more row runs our scanned layer stack (the configs' setting from 0.5B up) at the first
    preset and the middle batch.
  attention: jax.nn.dot_product_attention, causal, bf16, implementation "xla" against "cudnn"
    (where the backend has it), forward and forward + backward, per --attention_shapes;
    FLOPs = 2 B N H T^2 forward (causal half of QK^T and PV), 3.5x that with the backward.

Rows left when --budget_s seconds have passed are recorded as skipped, so the suite ends inside
a lease. --smoke replaces every shape with a tiny one (CPU, CI: tests/gpu_suite_test.py).
"""

import dataclasses
import functools
import json
import math
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks import train_step  # noqa: E402  (defines --runs, --steps, --dtype, ... ; see above)
from benchmarks.measure import (  # noqa: E402
    best_of,
    kv_bytes_per_token,
    matmul_params,
    matmul_peak,
    random_prompts,
    stream_bandwidth,
    time_ours,
    time_transformers,
)
from rlver_jax.models import hf_io, qwen2  # noqa: E402
from rlver_jax.models.config import Qwen2Config, get_preset  # noqa: E402

FLAGS = flags.FLAGS
_OUT = flags.DEFINE_string("out", "results/gpu_suite", "Results folder (gpu_suite.json, gpu_suite.md).")
_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny shapes on CPU, so that every part runs in CI.")
_DECODE_PRESETS = flags.DEFINE_list("decode_presets", ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"],
                                    "Model shapes of the decode part (random bf16 weights).")
_DECODE_BATCHES = flags.DEFINE_list("decode_batches", ["1", "32", "128"], "Decode batch sizes.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 128, "Tokens generated per row in the decode part.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "Longest decode prompt; rows have half to all of it.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed calls per decode row and side (the best is kept).")
_HBM = flags.DEFINE_float("hbm_tbps", 4.8, "HBM bandwidth of the decode roofline, TB/s (H200 datasheet).")
_ATTENTION = flags.DEFINE_list("attention_shapes", ["8x2048x14x2x64", "2x4096x28x4x128"],
                               "BxTxNxKxH shapes of the attention part (0.5B-like and 7B-like heads).")
_BUDGET = flags.DEFINE_integer("budget_s", 450, "Skip the rows left after this many seconds; 0: no limit.")

_SMOKE_FLAGS = dict(runs=["tiny:2x128"], steps=1, peak_tflops=1.0, torch_threads=1, decode_presets=["tiny"],
                    decode_batches=["2"], new_tokens=8, prompt_len=16, repeats=1,
                    attention_shapes=["1x64x4x2x16"], budget_s=0)
_FIT = 0.85  # share of the device memory a training run's states may take
_STATE_BYTES = 16  # per parameter in training: fp32 weights, gradients, AdamW mu and nu


@dataclasses.dataclass
class Suite:
    """Everything measured so far; written out after each part."""

    out: pathlib.Path
    start: float = dataclasses.field(default_factory=time.perf_counter)
    env: dict = dataclasses.field(default_factory=dict)
    train: list = dataclasses.field(default_factory=list)
    decode: list = dataclasses.field(default_factory=list)
    attention: list = dataclasses.field(default_factory=list)

    def out_of_time(self) -> bool:
        return bool(_BUDGET.value) and time.perf_counter() - self.start > _BUDGET.value

    def write(self) -> None:
        self.env["elapsed_s"] = round(time.perf_counter() - self.start, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        parts = {"env": self.env, "train": self.train, "decode": self.decode, "attention": self.attention}
        (self.out / "gpu_suite.json").write_text(json.dumps(parts, indent=1))
        (self.out / "gpu_suite.md").write_text(markdown(parts))


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def device_memory() -> int | None:
    """Bytes the first device may allocate, where the backend says (GPUs do, CPUs may not)."""
    try:
        return (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    except Exception:  # noqa: BLE001  (no memory statistics on this backend)
        return None


def release_torch() -> None:
    train_step.free_memory()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------- train


def train_part(suite: Suite, peak: float) -> None:
    limit = device_memory()
    for spec in FLAGS.runs:
        preset, batch_size, tokens = train_step.parse_run(spec)
        config = train_step.our_config(preset)  # --remat, --scan_layers, --dtype; smol: the fetched weights
        base = dict(run=spec, dtype=FLAGS.dtype, remat=FLAGS.remat, scan_layers=FLAGS.scan_layers)
        need = _STATE_BYTES * config.num_params()
        if limit and need > _FIT * limit:
            suite.train.append({**base, "skipped": f"needs {need / 2**30:.0f} GiB for fp32 weights, gradients and "
                                                   f"AdamW moments; the device has {limit / 2**30:.0f} GiB"})
            continue
        if suite.out_of_time():
            suite.train.append({**base, "skipped": "time budget"})
            continue
        batch = train_step.make_batch(config, batch_size, tokens, np.random.default_rng(FLAGS.seed))
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = hf_io.save_pretrained(config, train_step.init_params(preset, config),
                                              pathlib.Path(tmp) / preset)
            train_step.free_memory()
            try:
                ours, prepared = train_step.run_ours(preset, config, batch, score_all=False)
            except Exception as e:  # noqa: BLE001  (an OOM must not end a one-shot run)
                suite.train.append({**base, "side": "ours", "error": _error(e)})
                train_step.free_memory()
                continue
            train_step.free_memory()
            sides = [(ours, None)]
            try:
                sides.append(train_step.run_torch(model_dir, batch, prepared))
            except Exception as e:  # noqa: BLE001
                suite.train.append({**base, "side": "torch", "error": _error(e)})
            release_torch()
        torch_s = sides[1][0].step_s if len(sides) > 1 else None
        for result, parity in sides:
            flops = train_step.step_flops(config, batch_size, tokens, result.scored)
            suite.train.append({
                **base, "side": result.side, "step_s": result.step_s,
                "tokens_per_s": batch_size * tokens / result.step_s,
                "model_tflops": flops / result.step_s / 1e12, "mfu": flops / result.step_s / peak,
                "vs_torch": torch_s / result.step_s if torch_s else None, "logprob_parity": parity})
        print(f"  train {spec}: " + ", ".join(f"{r.side} {r.step_s:.3f} s" for r, _ in sides), flush=True)


# ---------------------------------------------------------------------------------- decode


def random_transformers(config: Qwen2Config, device: str):
    """transformers' Qwen2ForCausalLM of this shape, its own random bf16 weights, on `device`."""
    hf_config = transformers.Qwen2Config(**hf_io.config_to_hf(config, "bfloat16"))
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16).eval()


def roofline_ms(config: Qwen2Config, batch: int, prompt_lengths: np.ndarray, new_tokens: int) -> tuple[int, int, float]:
    """(weight bytes, KV bytes, ms) one bf16 decode step must read at the HBM bandwidth: the matmul
    weights once, and the keys and values of each row's real context, averaged over the steps."""
    weight_bytes = 2 * matmul_params(config)
    context = float(np.mean(prompt_lengths)) + new_tokens / 2
    kv_bytes = int(kv_bytes_per_token(config, 2) * batch * context)
    return weight_bytes, kv_bytes, (weight_bytes + kv_bytes) / (_HBM.value * 1e12) * 1e3


def decode_part(suite: Suite, device: str) -> None:
    n = _NEW_TOKENS.value
    batches = [int(b) for b in _DECODE_BATCHES.value]
    for p, preset in enumerate(_DECODE_PRESETS.value):
        if suite.out_of_time():
            suite.decode.append({"model": preset, "skipped": "time budget"})
            continue
        config = get_preset(preset, dtype="bfloat16", param_dtype="bfloat16")
        variants = [("ours", config, batches)]
        if p == 0:  # the scanned stack once, at the middle batch
            variants.append(("ours, scanned layers", config.replace(scan_layers=True), batches[len(batches) // 2:][:1]))
        hf_model = random_transformers(config, device)
        for side, cfg, side_batches in variants:
            params = jax.jit(functools.partial(qwen2.init_params, cfg))(jax.random.key(FLAGS.seed))
            for batch in side_batches:
                ids, mask = random_prompts(config.vocab_size, batch, _PROMPT_LEN.value,
                                           np.random.default_rng(FLAGS.seed))
                weight_bytes, kv_bytes, bound = roofline_ms(config, batch, mask.sum(1), n)
                row = dict(model=preset, batch=batch, new_tokens=n, prompt_len=_PROMPT_LEN.value,
                           weight_bytes=weight_bytes, kv_bytes=kv_bytes, roofline_ms=bound)
                for name in [side] + (["transformers"] if side == "ours" else []):
                    if suite.out_of_time():
                        suite.decode.append({**row, "side": name, "skipped": "time budget"})
                        continue
                    try:
                        if name == "transformers":
                            call_s, step_ms = time_transformers(hf_model, ids, mask, n, _REPEATS.value)
                        else:
                            call_s, step_ms = time_ours(cfg, params, ids, mask, n, _REPEATS.value, FLAGS.seed)
                    except Exception as e:  # noqa: BLE001
                        suite.decode.append({**row, "side": name, "error": _error(e)})
                        continue
                    suite.decode.append({**row, "side": name, "call_s": call_s, "step_ms": step_ms,
                                         "decode_tokens_per_s": batch / step_ms * 1e3,
                                         "of_roofline": bound / step_ms})
                    print(f"  decode {preset} batch {batch} {name}: {step_ms:.2f} ms/step "
                          f"(roofline {bound:.2f})", flush=True)
            params = None  # frees the device copy before the next variant
            train_step.free_memory()
        hf_model = None
        release_torch()
        suite.write()


# ------------------------------------------------------------------------------- attention


def attention_part(suite: Suite) -> None:
    for spec in _ATTENTION.value:
        b, t, n, k, h = (int(x) for x in spec.split("x"))
        keys = jax.random.split(jax.random.key(FLAGS.seed), 3)
        q = jax.random.normal(keys[0], (b, t, n, h), jnp.bfloat16)
        kk, v = (jax.random.normal(key, (b, t, k, h), jnp.bfloat16) for key in keys[1:])
        fwd_flops = 2 * b * n * h * t * t
        for impl in ("xla", "cudnn"):
            row = dict(shape=spec, implementation=impl)
            if suite.out_of_time():
                suite.attention.append({**row, "skipped": "time budget"})
                continue
            attend = functools.partial(jax.nn.dot_product_attention, is_causal=True, implementation=impl)
            fwd = jax.jit(attend)
            both = jax.jit(jax.grad(lambda q, k, v: attend(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2)))
            try:
                times = {}
                for name, fn in (("fwd", fwd), ("fwd_bwd", both)):
                    jax.block_until_ready(fn(q, kk, v))
                    times[name] = best_of(lambda: jax.block_until_ready(fn(q, kk, v)), 5)
            except Exception as e:  # noqa: BLE001  (cuDNN attention exists on NVIDIA GPUs only)
                suite.attention.append({**row, "unavailable": _error(e)})
                continue
            suite.attention.append({**row, "fwd_ms": times["fwd"] * 1e3, "fwd_tflops": fwd_flops / times["fwd"] / 1e12,
                                    "fwd_bwd_ms": times["fwd_bwd"] * 1e3,
                                    "fwd_bwd_tflops": 3.5 * fwd_flops / times["fwd_bwd"] / 1e12})
            print(f"  attention {spec} {impl}: fwd {times['fwd'] * 1e3:.2f} ms, "
                  f"fwd+bwd {times['fwd_bwd'] * 1e3:.2f} ms", flush=True)
    suite.write()


# -------------------------------------------------------------------------------- markdown


def _num(x, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _table(title: str, header: str, rows: list[dict], cells, note_keys: tuple[str, ...]) -> list[str]:
    """A markdown section: `header` ("| a | b |" with its alignment row), a line per row of
    `cells(row)` (its cell strings), then the first of `note_keys` the row has as its note."""
    lines = ["", f"## {title}", "", *header]
    for r in rows:
        note = next((r[k] for k in note_keys if r.get(k)), "")
        lines.append("| " + " | ".join([*cells(r), note]) + " |")
    return lines


def markdown(parts: dict) -> str:
    env = parts["env"]
    lines = ["# GPU suite", "", ", ".join(f"{k}: {v}" for k, v in env.items())]
    lines += _table("Train step", ["| run | side | step s | tokens/s | model TFLOP/s | MFU | vs torch | note |",
                                   "|---|---|---:|---:|---:|---:|---:|---|"], parts["train"],
                    lambda r: [r["run"], r.get("side", "-"), _num(r.get("step_s"), ".3f"),
                               _num(r.get("tokens_per_s"), ",.0f"), _num(r.get("model_tflops"), ".1f"),
                               _num(r.get("mfu"), ".1%"), _num(r.get("vs_torch"), ".2f")], ("skipped", "error"))
    lines += _table("Decode (bf16)", ["| model | batch | side | decode ms/step | decode tokens/s | roofline ms/step "
                                      "| of roofline | whole call s | note |",
                                      "|---|---:|---|---:|---:|---:|---:|---:|---|"],
                    parts["decode"],
                    lambda r: [r["model"], str(r.get("batch", "-")), r.get("side", "-"), _num(r.get("step_ms"), ".2f"),
                               _num(r.get("decode_tokens_per_s"), ",.0f"), _num(r.get("roofline_ms"), ".3f"),
                               _num(r.get("of_roofline"), ".1%"), _num(r.get("call_s"), ".2f")], ("skipped", "error"))
    lines += _table("Attention (causal, bf16)",
                    ["| B x T x N x K x H | implementation | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s "
                     "| note |",
                     "|---|---|---:|---:|---:|---:|---|"], parts["attention"],
                    lambda r: [r["shape"], r["implementation"], _num(r.get("fwd_ms"), ".2f"),
                               _num(r.get("fwd_tflops"), ".1f"), _num(r.get("fwd_bwd_ms"), ".2f"),
                               _num(r.get("fwd_bwd_tflops"), ".1f")], ("skipped", "unavailable"))
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    if _SMOKE.value:
        for name, value in _SMOKE_FLAGS.items():
            setattr(FLAGS, name, value)
    torch.set_num_threads(FLAGS.torch_threads)
    suite = Suite(pathlib.Path(_OUT.value))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    peak = FLAGS.peak_tflops * 1e12 or matmul_peak(FLAGS.dtype)
    suite.env.update(
        jax=jax.__version__, backend=jax.default_backend(), device=jax.devices()[0].device_kind,
        torch=torch.__version__, torch_device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
        transformers=transformers.__version__, smoke=_SMOKE.value, peak_tflops=peak / 1e12,
        peak_from="--peak_tflops" if FLAGS.peak_tflops else "measured 4096^2 matmul",
        measured_read_tbps=stream_bandwidth() / 1e12, roofline_hbm_tbps=_HBM.value,
        load_average=os.getloadavg()[0])
    print(f"{suite.env}", flush=True)
    suite.write()
    train_part(suite, peak)
    suite.write()
    decode_part(suite, device)
    attention_part(suite)
    suite.write()
    print((suite.out / "gpu_suite.md").read_text())


if __name__ == "__main__":
    FLAGS.set_default("runs", ["qwen2.5-0.5b:8x1024", "qwen2.5-1.5b:8x1024", "qwen2.5-7b:1x512"])
    FLAGS.set_default("dtype", "bfloat16")
    FLAGS.set_default("peak_tflops", 989.0)
    app.run(main)

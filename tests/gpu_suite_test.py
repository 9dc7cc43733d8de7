"""benchmarks/gpu_suite.py --smoke: every part of the GPU suite runs (tiny shapes, CPU) and its
results hold the numbers the tables are made of."""

import json
import math
import os
import pathlib
import subprocess
import sys

_ROOT = pathlib.Path(__file__).resolve().parents[1]

# The tiny preset by hand (vocab 512, width 64, 2 layers, 4 heads of 16, 2 kv heads, MLP 128, tied):
# per layer q, k, v kernels and biases (64 x 128 + 128), o (64 x 64), MLP (3 x 64 x 128), two norms.
_TINY_PARAMS = 512 * 64 + 2 * (64 * 128 + 128 + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
_TINY_KV_PER_TOKEN = 2 * 2 * 2 * 16 * 2  # (k, v) x layers x kv heads x head dim x 2 bytes


def test_smoke_runs_every_part(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(_ROOT), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "benchmarks/gpu_suite.py", "--smoke", f"--out={tmp_path}"],
                          cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_suite.json").read_text())
    table = (tmp_path / "gpu_suite.md").read_text()
    for title in ("## Train step", "## Decode (bf16)", "## Attention (causal, bf16)"):
        assert title in table

    train = {r["side"]: r for r in results["train"]}
    assert set(train) == {"ours", "torch"}
    for r in train.values():
        assert r["step_s"] > 0 and math.isclose(r["tokens_per_s"], 2 * 128 / r["step_s"])
        assert math.isclose(r["mfu"], r["model_tflops"] / results["env"]["peak_tflops"])
    assert train["torch"]["logprob_parity"] < 0.02  # both sides trained the same model (bf16 rounding apart)

    decode = {r["side"]: r for r in results["decode"]}
    assert set(decode) == {"ours", "transformers", "ours, scanned layers"}
    for r in decode.values():
        assert "error" not in r and "skipped" not in r
        assert r["weight_bytes"] == 2 * _TINY_PARAMS
        # batch 2, prompts of 8..16 tokens, 8 new: on average 4 of them in the context
        assert 2 * (8 + 4) * _TINY_KV_PER_TOKEN <= r["kv_bytes"] <= 2 * (16 + 4) * _TINY_KV_PER_TOKEN
        bound_ms = (r["weight_bytes"] + r["kv_bytes"]) / (results["env"]["roofline_hbm_tbps"] * 1e12) * 1e3
        assert math.isclose(r["roofline_ms"], bound_ms) and math.isclose(r["of_roofline"], bound_ms / r["step_ms"])

    attention = {r["implementation"]: r for r in results["attention"]}
    assert attention["xla"]["fwd_ms"] > 0 and attention["xla"]["fwd_bwd_ms"] > 0
    assert "cudnn" in attention  # timed on NVIDIA GPUs; on CPU recorded as unavailable

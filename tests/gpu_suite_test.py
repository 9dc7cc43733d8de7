"""benchmarks/gpu_suite.py --smoke: every part of the GPU suite runs (tiny shapes, CPU) and its
results hold the numbers the tables are made of."""

import json
import math
import pathlib

import pytest
import torch

from tests.fixtures_cli import run_script

_ROOT = pathlib.Path(__file__).resolve().parents[1]

# The tiny preset by hand (vocab 512, width 64, 2 layers, 4 heads of 16, 2 kv heads, MLP 128, tied):
# per layer q, k, v kernels and biases (64 x 128 + 128), o (64 x 64), MLP (3 x 64 x 128), two norms.
_TINY_PARAMS = 512 * 64 + 2 * (64 * 128 + 128 + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
_TINY_KV_PER_TOKEN = 2 * 2 * 2 * 16 * 2  # (k, v) x layers x kv heads x head dim x 2 bytes
# Model FLOPs of the smoke's train step (2 rows of 128 tokens, benchmarks/train_step.py's formula) by hand:
# per row 6 x 74,304 (the parameters but the tied head) x 128 + causal attention 6 x 2 x 4 x 16 x 128 x 129,
# 69,746,688; the LM head 6 x 512 x 64 per scored token: ours scores the 2 x 64 policy tokens, torch all 256.
_TINY_STEP_FLOPS = {"ours": 2 * 69_746_688 + 196_608 * 128, "torch": 2 * 69_746_688 + 196_608 * 256}
_TINY_STEP_TOKENS = 2 * 128
_HBM_BYTES_PER_MS = 4.8e9  # the roofline's default 4.8 TB/s


@pytest.mark.slow
def test_smoke_runs_every_part(tmp_path):
    threads = torch.get_num_threads()
    try:  # in this process (a fresh interpreter would spend ~15 s importing torch and jax again)
        proc = run_script("benchmarks/gpu_suite.py", "--smoke", f"--out={tmp_path}")
    finally:
        torch.set_num_threads(threads)  # the suite sets torch's threads for the process
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_suite.json").read_text())
    table = (tmp_path / "gpu_suite.md").read_text()
    for title in ("## Train step", "## Decode (bf16)", "## Attention (causal, bf16)"):
        assert title in table

    train = {r["side"]: r for r in results["train"]}
    assert set(train) == {"ours", "torch"}
    assert results["env"]["peak_tflops"] == 1.0  # the smoke's --peak_tflops: MFU x step seconds = TFLOPs of a step
    for side, r in train.items():
        assert r["step_s"] > 0 and math.isclose(r["tokens_per_s"] * r["step_s"], _TINY_STEP_TOKENS)
        assert math.isclose(r["model_tflops"] * r["step_s"], _TINY_STEP_FLOPS[side] / 1e12)
        assert math.isclose(r["mfu"] * r["step_s"], _TINY_STEP_FLOPS[side] / 1e12)
    assert train["torch"]["logprob_parity"] < 0.02  # both sides trained the same model (bf16 rounding apart)

    decode = {r["side"]: r for r in results["decode"]}
    assert set(decode) == {"ours", "transformers", "ours, scanned layers"}
    for r in decode.values():
        assert "error" not in r and "skipped" not in r
        assert r["weight_bytes"] == 2 * _TINY_PARAMS
        # batch 2, prompts of 8..16 tokens, 8 new: on average 4 of them in the context
        assert 2 * (8 + 4) * _TINY_KV_PER_TOKEN <= r["kv_bytes"] <= 2 * (16 + 4) * _TINY_KV_PER_TOKEN
        assert math.isclose(r["roofline_ms"], (2 * _TINY_PARAMS + r["kv_bytes"]) / _HBM_BYTES_PER_MS)
        assert math.isclose(r["of_roofline"] * r["step_ms"], r["roofline_ms"])  # roofline / measured

    attention = {r["implementation"]: r for r in results["attention"]}
    assert attention["xla"]["fwd_ms"] > 0 and attention["xla"]["fwd_bwd_ms"] > 0
    assert "cudnn" in attention  # timed on NVIDIA GPUs; on CPU recorded as unavailable

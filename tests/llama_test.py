"""Llama-family checkpoints: a random tiny transformers LlamaForCausalLM (untied embeddings, head_dim
other than hidden/heads, llama3 RoPE, and the optional biases) read, run and written back."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
import torch
import transformers

from rlver_jax.models import hf_io, qwen2
from tests.fixtures_hf import left_padded_batch, make_hf_model, perturb_biases_and_norms, torch_logits

_HF_LLAMA = dict(
    vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=256,
    tie_word_embeddings=False, rope_theta=500000.0,
    # Short wavelengths kept, long ones scaled, the band between interpolated: head_dim 16 at theta 5e5
    # spans all three for an original context of 64.
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64})


def make_llama(tmp_path, seed: int = 0, **extra):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**_HF_LLAMA, **extra})
    model = perturb_biases_and_norms(transformers.LlamaForCausalLM(config).eval())
    out = tmp_path / f"llama_{seed}"
    model.save_pretrained(out)
    return model, out


def test_rope_frequencies_are_transformers_llama3():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = hf_io.config_from_hf({**_HF_LLAMA, "model_type": "llama", "num_hidden_layers": 1})
    theirs, scale = ROPE_INIT_FUNCTIONS["llama3"](transformers.LlamaConfig(**_HF_LLAMA))
    ours = np.asarray(qwen2.rope_frequencies(config))
    plain = np.asarray(qwen2.rope_frequencies(config.replace(rope_scaling=None)))
    assert scale == 1.0 and (ours < plain).any() and (ours == plain).any()  # both regimes are exercised
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("biases", [False, True])
def test_llama_logits_match_transformers(tmp_path, biases):
    extra = dict(attention_bias=True, mlp_bias=True) if biases else {}
    model, path = make_llama(tmp_path, **extra)
    config, params = hf_io.load_pretrained(path)
    assert (config.architecture, config.head_dim, config.untied_lm_head) == ("llama", 16, True)
    assert config.rope_scaling.factor == 8.0
    names = {"/".join(k.key for k in p) for p, _ in jax.tree_util.tree_leaves_with_path(params)}
    assert any("q_bias" in n for n in names) == biases and any("down_bias" in n for n in names) == biases
    ids, mask, positions = left_padded_batch(config.vocab_size)
    # Positions past the original context, where llama3's rescaling matters.
    ids = np.concatenate([ids, np.random.default_rng(1).integers(1, 96, (3, 100))], axis=1)
    mask = np.concatenate([mask, np.ones((3, 100), mask.dtype)], axis=1)
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    ours = np.asarray(jax.jit(qwen2.forward, static_argnums=0)(config, params, jnp.asarray(ids), jnp.asarray(mask)))
    valid = mask.astype(bool)
    np.testing.assert_allclose(ours[valid], torch_logits(model, ids, mask, positions)[valid], atol=1e-4, rtol=0)
    # Written back as a LlamaForCausalLM, bit for bit, with the same tensor names as transformers'.
    out = hf_io.save_pretrained(config, params, tmp_path / "export")
    written = json.loads((out / "config.json").read_text())
    assert written["architectures"] == ["LlamaForCausalLM"] and written["model_type"] == "llama"
    with safetensors.safe_open(str(out / "model.safetensors"), "numpy") as f, \
            safetensors.safe_open(str(path / "model.safetensors"), "numpy") as g:
        assert set(f.keys()) == set(g.keys())
        for name in g.keys():
            np.testing.assert_array_equal(f.get_tensor(name), g.get_tensor(name))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(reloaded).__name__ == "LlamaForCausalLM"
    assert reloaded.config.rope_parameters["rope_type"] == "llama3"
    np.testing.assert_allclose(torch_logits(reloaded, ids, mask, positions)[valid],
                               torch_logits(model, ids, mask, positions)[valid], atol=0, rtol=0)
    assert hf_io.config_from_hf(written) == config


def test_llama_critic_exports_as_llama_token_classification(tmp_path):
    from rlver_jax.train import model_loading
    _, path = make_llama(tmp_path)
    config, params = hf_io.load_pretrained(path)
    critic_cfg, critic = model_loading.critic_from_actor(config, params)
    out = hf_io.save_pretrained(critic_cfg, critic, tmp_path / "critic")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForTokenClassification"]
    model = transformers.AutoModelForTokenClassification.from_pretrained(out, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForTokenClassification"


def test_unsupported_llama_fields_are_refused():
    base = {**_HF_LLAMA, "model_type": "llama"}
    with pytest.raises(hf_io.CheckpointError, match="pretraining_tp=2"):
        hf_io.config_from_hf({**base, "pretraining_tp": 2})
    with pytest.raises(hf_io.CheckpointError, match=r"rope_scaling \(rope_type 'llama3'\) lacks 'low_freq_factor'"):
        hf_io.config_from_hf({**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(hf_io.CheckpointError, match="model_type='mistral'"):
        hf_io.config_from_hf({**base, "model_type": "mistral"})


def test_biases_the_config_lacks_are_an_error(tmp_path):
    """A Qwen2 checkpoint relabelled llama keeps its q/k/v bias tensors: refused, not dropped."""
    _, path = make_hf_model(tmp_path, tied=True)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(hf_io.CheckpointError,
                       match=r"holds 6 bias tensors .*'model.layers.0.self_attn.k_proj.bias'.*model_type='llama'"):
        hf_io.load_pretrained(path)

"""Parity of the Flax Qwen2 with transformers' PyTorch Qwen2ForCausalLM, and KV-cache decoding."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
import torch
import transformers

from rlver_jax.models import hf_io, qwen2
from rlver_jax.models.config import get_preset
from rlver_jax.train import model_loading
from tests.fixtures_hf import HF_TINY, left_padded_batch, make_hf_model, torch_logits

# The model's functions as programs: one compile each, instead of one per operation run eagerly.
_forward = jax.jit(qwen2.forward, static_argnums=0)
_hidden_states = jax.jit(qwen2.hidden_states, static_argnums=0)
_logits_from_hidden = jax.jit(qwen2.logits_from_hidden, static_argnums=0)

@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("scan", [False, True])
def test_logits_match_transformers(tmp_path, tied, scan):
    model, path = make_hf_model(tmp_path, tied)
    config, params = hf_io.load_pretrained(path, scan_layers=scan)
    assert config.tie_word_embeddings == tied
    ids, mask, positions = left_padded_batch(config.vocab_size)
    ours = np.asarray(_forward(config, params, jnp.asarray(ids), jnp.asarray(mask)))
    ref = torch_logits(model, ids, mask, positions)
    valid = mask.astype(bool)
    np.testing.assert_allclose(ours[valid], ref[valid], atol=1e-4, rtol=0)


def test_the_accelerators_matmul_form_matches_transformers(tmp_path, monkeypatch):
    """On TPU and GPU the projections contract the weights as they are (a dot_general over
    [D, N, H] and [N, H, D]), not reshaped to 2-D as on CPU (qwen2._dense): traced as for a TPU
    target here and run on CPU, the model's logits are still transformers'."""
    monkeypatch.setattr(qwen2.attention, "target_platform", lambda: "tpu")
    model, path = make_hf_model(tmp_path, tied=False)
    config, params = hf_io.load_pretrained(path, scan_layers=True)
    config = dataclasses.replace(config, attention="xla")  # "auto" on a TPU target is the splash kernel
    ids, mask, positions = left_padded_batch(config.vocab_size)
    ours = np.asarray(jax.jit(qwen2.forward, static_argnums=0)(config, params, jnp.asarray(ids), jnp.asarray(mask)))
    ref = torch_logits(model, ids, mask, positions)
    valid = mask.astype(bool)
    np.testing.assert_allclose(ours[valid], ref[valid], atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False])
def test_save_pretrained_loads_in_transformers(tmp_path, tied):
    config = get_preset("tiny", tie_word_embeddings=tied)
    params = qwen2.init_params(config, jax.random.key(1))
    path = hf_io.save_pretrained(config, params, tmp_path / "export")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    ids, mask, positions = left_padded_batch(config.vocab_size)
    ours = np.asarray(_forward(config, params, jnp.asarray(ids), jnp.asarray(mask)))
    np.testing.assert_allclose(ours[mask.astype(bool)], torch_logits(model, ids, mask, positions)[mask.astype(bool)],
                               atol=1e-4, rtol=0)
    # And back: our loader reads our writer's output exactly.
    _, reloaded = hf_io.load_pretrained(path)
    jax.tree.map(np.testing.assert_array_equal, reloaded, params)


def test_critic_exports_as_token_classification_without_lm_head(tmp_path):
    """A critic (untied 7B-like layout) is written as Qwen2ForTokenClassification with one label:
    no lm_head tensor; transformers' scores are our values; our loader reads it back exactly, and
    a causal-LM checkpoint loads as a critic with a zero value head and no LM head."""
    config = get_preset("tiny", tie_word_embeddings=False)
    critic_cfg, critic = model_loading.critic_from_actor(config, qwen2.init_params(config, jax.random.key(4)))
    critic["value_kernel"] = jax.random.normal(jax.random.key(5), critic["value_kernel"].shape)
    critic["value_bias"] = jnp.asarray(0.25, jnp.float32)
    path = hf_io.save_pretrained(critic_cfg, critic, tmp_path / "critic")
    with safetensors.safe_open(str(path / "model.safetensors"), "numpy") as f:
        names = set(f.keys())
    assert "lm_head.weight" not in names and {"score.weight", "score.bias"} <= names
    model = transformers.AutoModelForTokenClassification.from_pretrained(path, torch_dtype=torch.float32).eval()
    ids, mask, positions = left_padded_batch(config.vocab_size)
    h, _ = _hidden_states(critic_cfg, critic, jnp.asarray(ids), jnp.asarray(mask))
    ours = np.asarray(qwen2.values_from_hidden(critic_cfg, critic, h))
    theirs = torch_logits(model, ids, mask, positions)[..., 0]
    np.testing.assert_allclose(ours[mask.astype(bool)], theirs[mask.astype(bool)], atol=1e-4, rtol=0)
    _, reloaded = hf_io.load_pretrained(path, value_head=True)
    jax.tree.map(np.testing.assert_array_equal, reloaded, critic)
    _, model_path = make_hf_model(tmp_path, tied=False)
    lm_cfg, from_lm = hf_io.load_pretrained(model_path, value_head=True)
    assert "lm_head" not in from_lm and float(jnp.abs(from_lm["value_kernel"]).sum()) == 0.0
    assert jax.tree.structure(from_lm) == jax.tree.structure(qwen2.abstract_params(lm_cfg))


def test_sharded_checkpoint_roundtrip(tmp_path):
    config = get_preset("tiny")
    params = qwen2.init_params(config, jax.random.key(2))
    path = hf_io.save_pretrained(config, params, tmp_path / "sharded", max_shard_bytes=40_000)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    _, reloaded = hf_io.load_pretrained(path, scan_layers=True)
    np.testing.assert_array_equal(reloaded["layers"]["attn"]["q_kernel"][1], params["layer_1"]["attn"]["q_kernel"])


@pytest.mark.slow
def test_kv_cache_decoding_equals_full_forward(tmp_path):
    config = get_preset("tiny")
    params = qwen2.init_params(config, jax.random.key(3))
    ids, mask, positions = left_padded_batch(config.vocab_size)
    full = np.asarray(_forward(config, params, jnp.asarray(ids), jnp.asarray(mask)))
    # Prefill the first 4 slots, then feed one token at a time through the cache.
    cache = qwen2.init_cache(config, ids.shape[0], max_len=16)
    steps = [(0, 4)] + [(t, t + 1) for t in range(4, ids.shape[1])]
    got = []
    for lo, hi in steps:
        h, cache = _hidden_states(config, params, jnp.asarray(ids[:, lo:hi]), jnp.asarray(mask[:, lo:hi]),
                                  jnp.asarray(positions[:, lo:hi]), cache)
        got.append(np.asarray(_logits_from_hidden(config, params, h)))
    got = np.concatenate(got, axis=1)
    valid = mask.astype(bool)
    np.testing.assert_allclose(got[valid], full[valid], atol=1e-5, rtol=0)
    assert int(cache.index) == ids.shape[1]


def cached_greedy(config, params, ids, mask, positions, new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy decoding through the KV cache (one prefill call, then one token per call): the
    tokens [B, N] and the logits [B, N, V] each was chosen from."""
    step = jax.jit(lambda p, cache, ids, mask, pos: qwen2.hidden_states(config, p, ids, mask, pos, cache))
    cache = qwen2.init_cache(config, ids.shape[0], ids.shape[1] + new_tokens)
    h, cache = step(params, cache, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(positions))
    tokens, logits = [], []
    for i in range(new_tokens):
        logits.append(qwen2.logits_from_hidden(config, params, h[:, -1:]))
        tokens.append(jnp.argmax(logits[-1], axis=-1))  # [B, 1]
        pos = jnp.asarray(positions[:, -1:] + 1 + i)
        h, cache = step(params, cache, tokens[-1], jnp.ones_like(tokens[-1], bool), pos)
    return np.concatenate(tokens, axis=1), np.concatenate(logits, axis=1)


@pytest.mark.parametrize("scan", [False, True])
def test_cached_greedy_decoding_equals_transformers_generate(tmp_path, scan):
    """The in-place per-layer cache update, in the unrolled and the scanned stack."""
    model, path = make_hf_model(tmp_path, tied=True)
    config, params = hf_io.load_pretrained(path, scan_layers=scan)
    ids, mask, positions = left_padded_batch(config.vocab_size)
    n = 10
    with torch.no_grad():
        ref = model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), do_sample=False,
                             max_new_tokens=n, min_new_tokens=n, pad_token_id=0, return_dict_in_generate=True,
                             output_logits=True)
    tokens, logits = cached_greedy(config, params, ids, mask, positions, n)
    np.testing.assert_array_equal(tokens, ref.sequences.numpy()[:, ids.shape[1]:])
    np.testing.assert_allclose(logits, torch.stack(ref.logits, dim=1).numpy(), atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_bf16_cached_decoding_stays_close_to_fp32(tmp_path, scan):
    """A bf16 cache (held as raw bits) reads back as the keys and values it was given."""
    _, path = make_hf_model(tmp_path, tied=True)
    cfg32, p32 = hf_io.load_pretrained(path)
    cfg16, p16 = hf_io.load_pretrained(path, dtype="bfloat16", scan_layers=scan)
    ids, mask, positions = left_padded_batch(cfg32.vocab_size)
    full32 = np.asarray(_forward(cfg32, p32, jnp.asarray(ids), jnp.asarray(mask)))
    cache = qwen2.init_cache(cfg16, ids.shape[0], max_len=16)
    got = []
    for t in range(ids.shape[1]):  # one token at a time: every logit but the first reads the cache
        h, cache = _hidden_states(cfg16, p16, jnp.asarray(ids[:, t:t + 1]), jnp.asarray(mask[:, t:t + 1]),
                                  jnp.asarray(positions[:, t:t + 1]), cache)
        got.append(np.asarray(_logits_from_hidden(cfg16, p16, h)))
    got = np.concatenate(got, axis=1)
    valid = mask.astype(bool)
    assert np.max(np.abs(got[valid] - full32[valid])) < 0.05 * np.max(np.abs(full32[valid]))
    assert (got[valid].argmax(-1) == full32[valid].argmax(-1)).mean() > 0.9


def test_bf16_stays_close_to_fp32(tmp_path):
    _, path = make_hf_model(tmp_path, tied=True)
    cfg32, p32 = hf_io.load_pretrained(path)
    cfg16, p16 = hf_io.load_pretrained(path, dtype="bfloat16")
    assert cfg16.dtype == "bfloat16" and p16["embed"]["embedding"].dtype == jnp.bfloat16
    ids, mask, _ = left_padded_batch(cfg32.vocab_size)
    l32 = np.asarray(_forward(cfg32, p32, jnp.asarray(ids), jnp.asarray(mask)))
    l16 = np.asarray(_forward(cfg16, p16, jnp.asarray(ids), jnp.asarray(mask)))
    valid = mask.astype(bool)
    assert l16.dtype == np.float32
    assert np.max(np.abs(l16[valid] - l32[valid])) < 0.05 * np.max(np.abs(l32[valid]))
    assert (l16[valid].argmax(-1) == l32[valid].argmax(-1)).mean() > 0.9


def test_load_errors_name_file_and_tensor(tmp_path):
    with pytest.raises(hf_io.CheckpointError, match="config.json"):
        hf_io.load_pretrained(tmp_path / "nowhere")
    _, path = make_hf_model(tmp_path, tied=True)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral"}))  # llama: tests/llama_test.py
    with pytest.raises(hf_io.CheckpointError, match="model_type='mistral'"):
        hf_io.load_pretrained(path)
    (path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 81}))
    with pytest.raises(hf_io.CheckpointError, match=r"model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight'"):
        hf_io.load_pretrained(path)


@pytest.mark.slow
def test_value_head_and_logical_axes():
    config = get_preset("tiny", value_head=True, scan_layers=True)
    params = qwen2.init_params(config, jax.random.key(0))
    axes = qwen2.logical_axes(config)
    assert tuple(axes["layers"]["attn"]["q_kernel"]) == ("layers", "embed", "heads", "head_dim")
    assert tuple(axes["embed"]["embedding"]) == ("vocab", "embed")
    # Every leaf has one logical name per dimension.
    jax.tree.map(lambda p, a: len(a) == p.ndim or pytest.fail(f"{a} vs {p.shape}"), params, axes,
                 is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    ids = jnp.ones((2, 5), jnp.int32)
    h, _ = _hidden_states(config, params, ids)
    assert qwen2.values_from_hidden(config, params, h).shape == (2, 5)


@pytest.mark.slow
def test_remat_does_not_change_gradients():
    base = get_preset("tiny")
    params = qwen2.init_params(base, jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (2, 6), 0, base.vocab_size)

    def loss(p, cfg):
        return jnp.mean(jax.nn.log_softmax(qwen2.forward(cfg, p, ids))[..., 0])

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    g0 = grad(params, base)
    g1 = grad(params, base.replace(remat="full"))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), g0, g1)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 4])  # T=11 and 12: chunks of 1 token; of 4 (and 1)
def test_mlp_over_token_chunks_matches_transformers_and_the_whole_mlps_gradients(tmp_path, chunk):
    model, path = make_hf_model(tmp_path, tied=False)
    config, params = hf_io.load_pretrained(path, scan_layers=True, remat="full")
    chunked = config.replace(mlp_chunk=chunk)
    ids, mask, positions = left_padded_batch(config.vocab_size)
    valid = mask.astype(bool)
    ours = np.asarray(_forward(chunked, params, jnp.asarray(ids), jnp.asarray(mask)))
    np.testing.assert_allclose(ours[valid], torch_logits(model, ids, mask, positions)[valid], atol=1e-4, rtol=0)
    wide = jnp.asarray(np.pad(ids, ((0, 0), (1, 0)))), jnp.asarray(np.pad(mask, ((0, 0), (1, 0))))  # T=12

    def loss(p, cfg):
        logp = jax.nn.log_softmax(qwen2.forward(cfg, p, *wide))
        return jnp.sum(jnp.where(wide[1][..., None] > 0, logp[..., :7], 0.0))

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    g_whole, g_chunked = grad(params, config), grad(params, chunked)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), g_whole, g_chunked)


# --------------------------------------------------------------------------- config_from_hf: RoPE spellings

_HF_CONFIG = dict(HF_TINY, model_type="qwen2")


def test_config_from_hf_reads_plain_rope_in_both_spellings():
    """transformers 4 writes rope_theta; 5 writes rope_parameters (rope_theta beside it or not).
    The reference is transformers' own Qwen2Config reading the same dict."""
    base = {k: v for k, v in _HF_CONFIG.items() if k != "rope_theta"}
    spellings = [
        {"rope_theta": 5e5},
        {"rope_theta": 5e5, "rope_scaling": None},
        {"rope_theta": 5e5, "rope_scaling": {"rope_type": "default"}},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}, "rope_theta": 5e5},
        {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5}}},
    ]
    for extra in spellings:
        hf = {**base, **extra}
        assert hf_io.config_from_hf(hf).rope_theta == 5e5, extra
        if "full_attention" not in extra.get("rope_parameters", {}):
            assert transformers.Qwen2Config(**hf).rope_parameters["rope_theta"] == 5e5, extra
    # Neither spelling: Qwen2's default theta, as transformers.
    assert hf_io.config_from_hf(base).rope_theta == transformers.Qwen2Config(**base).rope_parameters["rope_theta"]


@pytest.mark.parametrize("field", ["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("spec", [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},  # transformers < 4.45
    {"rope_type": "linear", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "longrope", "factor": 2.0},  # llama3 is implemented: tests/llama_test.py
])
def test_config_from_hf_rejects_other_rope_types(field, spec):
    kind = spec.get("rope_type", spec.get("type"))
    hf = {**_HF_CONFIG, field: {**spec, "rope_theta": 10000.0}}
    with pytest.raises(hf_io.CheckpointError, match=rf"config.json: {field} has rope_type='{kind}'.*not supported"):
        hf_io.config_from_hf(hf)
    nested = {**_HF_CONFIG, "rope_parameters": {"full_attention": {**spec, "rope_theta": 10000.0}}}
    with pytest.raises(hf_io.CheckpointError, match=rf"rope_parameters.full_attention has rope_type='{kind}'"):
        hf_io.config_from_hf(nested)


def test_config_from_hf_rejects_ambiguous_rope():
    with pytest.raises(hf_io.CheckpointError, match=r"RoPE thetas disagree.*rope_parameters.*rope_theta"):
        hf_io.config_from_hf({**_HF_CONFIG, "rope_theta": 1e6,
                              "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})
    with pytest.raises(hf_io.CheckpointError, match="partial_rotary_factor=0.5"):
        hf_io.config_from_hf({**_HF_CONFIG, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                                "partial_rotary_factor": 0.5}})

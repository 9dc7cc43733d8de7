"""LoRA adapters (models/lora.py): merge against numpy, the PEFT format against peft, settings checks."""

import numpy as np
import pytest
import torch
import transformers

import jax
import jax.numpy as jnp

from rlver_jax.models import hf_io, lora, qwen2
from rlver_jax.models.config import get_preset


def _random_adapters(settings, base, seed=1):
    """Adapters with non-zero B (a fresh one has B = 0), so the delta is visible."""
    ad = lora.init_adapters(settings, base, jax.random.key(seed))
    leaves, tree = jax.tree_util.tree_flatten(ad)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    return jax.tree_util.tree_unflatten(tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


@pytest.fixture(scope="module")
def tiny():
    config = get_preset("tiny")
    return config, qwen2.init_params(config, jax.random.key(0))


def test_fresh_adapters_leave_the_base_and_merge_matches_numpy(tiny):
    """The scanned stack (a leading layer axis); the unrolled one is the export test's."""
    scan_layers = True
    config = tiny[0].replace(scan_layers=True)
    unrolled = tiny[1]
    base = {k: v for k, v in unrolled.items() if not k.startswith("layer_")}
    base["layers"] = jax.tree.map(lambda *x: jnp.stack(x), unrolled["layer_0"], unrolled["layer_1"])
    assert jax.tree.structure(base) == jax.tree.structure(qwen2.abstract_params(config))
    settings = lora.LoraSettings(rank=4, alpha=8.0, targets=("q", "o", "down"))
    fresh = lora.merge(settings, base, lora.init_adapters(settings, base, jax.random.key(1)))
    for x, y in zip(jax.tree_util.tree_leaves(fresh), jax.tree_util.tree_leaves(base)):
        np.testing.assert_array_equal(x, y)
    ad = _random_adapters(settings, base)
    merged = lora.merge(settings, base, ad)
    group = "layers" if scan_layers else "layer_1"
    w, a, b = (np.asarray(t) for t in (base[group]["attn"]["o_kernel"], ad[group]["attn"]["o_kernel"]["lora_a"],
                                       ad[group]["attn"]["o_kernel"]["lora_b"]))
    if scan_layers:
        w, a, b = w[1], a[1], b[1]
    n, h, d = w.shape  # o_kernel [N, H, D]: two input dims
    want = w + 2.0 * (a.reshape(n * h, 4) @ b).reshape(n, h, d)
    got = np.asarray(merged[group]["attn"]["o_kernel"])[1 if scan_layers else ...]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(merged[group]["attn"]["k_kernel"], base[group]["attn"]["k_kernel"])
    axes = lora.adapter_axes(settings, qwen2.logical_axes(config))
    lead = ("layers",) if scan_layers else ()
    assert tuple(axes[group]["attn"]["q_kernel"]["lora_a"]) == lead + ("embed", "lora_rank")
    assert tuple(axes[group]["attn"]["q_kernel"]["lora_b"]) == lead + ("lora_rank", "heads", "head_dim")


def test_rank_zero_is_the_base_itself(tiny):
    assert lora.merge(lora.LoraSettings(), tiny[1], {}) is tiny[1]


def test_merged_export_and_peft_adapter_give_our_logits(tmp_path, tiny):
    peft = pytest.importorskip("peft")
    config, base = tiny
    settings = lora.LoraSettings(rank=4, alpha=8.0)
    ad = _random_adapters(settings, base)
    merged = lora.merge(settings, base, ad)
    ids = np.array([[3, 17, 200, 5, 99, 411]])
    ours = np.asarray(qwen2.forward(config, merged, jnp.asarray(ids)))

    hf_io.save_pretrained(config, base, tmp_path / "base")
    hf_io.save_pretrained(config, merged, tmp_path / "merged")
    lora.save_peft_adapter(settings, config, ad, tmp_path / "adapter", str(tmp_path / "base"))
    from safetensors import safe_open
    with safe_open(str(tmp_path / "merged" / "model.safetensors"), "np") as f:
        assert not [k for k in f.keys() if "lora" in k]

    with torch.no_grad():
        plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", torch_dtype=torch.float32)
        got_merged = plain(torch.tensor(ids)).logits.numpy()
        hf_base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", torch_dtype=torch.float32)
        got_base = hf_base(torch.tensor(ids)).logits.numpy()
        adapted = peft.PeftModel.from_pretrained(hf_base, tmp_path / "adapter")
        got_peft = adapted(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(got_merged, ours, atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(got_peft, ours, atol=2e-4, rtol=1e-4)
    assert np.abs(got_base - ours).max() > 1e-3  # the adapters changed the model


def test_settings_name_the_bad_fields():
    with pytest.raises(ValueError, match=r"config.lora.rank=-1 must be >= 0"):
        lora.LoraSettings(rank=-1)
    with pytest.raises(ValueError, match=r"config.lora.alpha=0.0 must be > 0"):
        lora.LoraSettings(rank=8, alpha=0.0)
    with pytest.raises(ValueError, match=r"config.lora.targets"):
        lora.LoraSettings(rank=8, targets=("qkv",))


def test_config_lora_section_is_checked_with_the_training_settings():
    from configs.grpo_think import get_config
    from rlver_jax.train import run

    config = get_config("tiny")
    assert run.training_settings(config).lora == lora.LoraSettings(rank=0, alpha=16.0)
    config.lora.targets = "q,v"
    config.lora.rank = -2
    with pytest.raises(ValueError, match=r"config.lora.rank=-2 must be >= 0"):
        run.training_settings(config)
    config.lora.rank = 8
    with pytest.raises(ValueError, match=r"config.lora.rank=8: LoRA training is not wired"):
        run.training_settings(config)
    assert lora.LoraSettings.from_config(config.lora).targets == ("q", "v")


def test_gradients_reach_only_the_adapters_by_the_chain_rule(tiny):
    """d/dA and d/dB of a loss through the merge equal the hand chain rule from d/dW:
    dA = scale * dW @ B^T, dB = scale * A^T @ dW (the gate kernel, [D, F])."""
    config, base = tiny
    settings = lora.LoraSettings(rank=4, alpha=8.0, targets=("gate",))
    ad = _random_adapters(settings, base)

    def loss(params):  # any smooth function of the kernels (a forward pass would only cost time)
        return jnp.sum(jnp.sin(params["layer_0"]["mlp"]["gate_kernel"] * 30.0)) + jnp.sum(
            params["layer_1"]["mlp"]["gate_kernel"] ** 2)

    g = jax.grad(lora.on_adapters(settings, base, loss))(ad)
    assert set(g) == {"layer_0", "layer_1"} and set(g["layer_0"]) == {"mlp"}
    merged = lora.merge(settings, base, ad)
    g_w = np.asarray(jax.grad(loss)(merged)["layer_0"]["mlp"]["gate_kernel"])
    a, b = (np.asarray(ad["layer_0"]["mlp"]["gate_kernel"][k]) for k in ("lora_a", "lora_b"))
    np.testing.assert_allclose(g["layer_0"]["mlp"]["gate_kernel"]["lora_a"], 2.0 * g_w @ b.T, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(g["layer_0"]["mlp"]["gate_kernel"]["lora_b"], 2.0 * a.T @ g_w, rtol=1e-4, atol=1e-7)

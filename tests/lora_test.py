"""LoRA adapters (models/lora.py): merge against numpy, the PEFT format against peft, settings checks."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers

from rlver_jax.models import hf_io, lora, qwen2
from rlver_jax.models.config import get_preset
from rlver_jax.rl import program as rl_program
from rlver_jax.rl import train_state, update
from rlver_jax.rl.optimizer import Optimizer
from rlver_jax.rl.settings import RLSettings
from rlver_jax.train import model_loading
from tests.fixtures_cli import run_script
from tests.rl_helpers import training_batch


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


def test_modules_to_save_train_their_leaves_as_deltas(tiny):
    """Each leaf of modules_to_save gets a zero {"delta"} with its leaf's axes and merges as W + delta
    (numpy); an untied LM head is among "embed"'s, a critic (no LM head) has none to train."""
    config = tiny[0].replace(scan_layers=True, tie_word_embeddings=False)
    base = qwen2.init_params(config, jax.random.key(0))
    settings = lora.LoraSettings(rank=4, targets=("q",), modules_to_save=("embed", "norms"))
    fresh = lora.init_adapters(settings, base, jax.random.key(1))
    paths = [("embed", "embedding"), ("lm_head",), ("final_norm", "scale"), ("layers", "input_norm", "scale"),
             ("layers", "post_attn_norm", "scale")]
    deltas = {jax.tree_util.keystr(p[:-1]) for p, _ in jax.tree_util.tree_leaves_with_path(fresh)
              if p[-1].key == "delta"}
    assert deltas == {jax.tree_util.keystr(tuple(jax.tree_util.DictKey(k) for k in p)) for p in paths}
    ad = _random_adapters(settings, base)
    merged = lora.merge(settings, base, ad)
    axes, ad_axes = qwen2.logical_axes(config), lora.adapter_axes(settings, qwen2.logical_axes(config))
    for p in paths:
        get = lambda t, p=p: functools.reduce(lambda n, k: n[k], p, t)
        np.testing.assert_allclose(get(merged), np.asarray(get(base)) + np.asarray(get(ad)["delta"]), rtol=1e-6)
        assert get(ad_axes)["delta"] == get(axes)
    np.testing.assert_array_equal(merged["layers"]["mlp"]["up_kernel"], base["layers"]["mlp"]["up_kernel"])
    critic_cfg, critic = model_loading.critic_from_actor(config, base)
    assert "lm_head" not in lora.init_adapters(settings, qwen2.abstract_params(critic_cfg), jax.random.key(1))
    with pytest.raises(ValueError, match=r"config.lora.modules_to_save='embed,heads': use a subset of"):
        lora.LoraSettings(rank=4, modules_to_save=("embed", "heads"))


def test_rank_zero_is_the_base_itself(tiny):
    assert lora.merge(lora.LoraSettings(), tiny[1], {}) is tiny[1]


@pytest.mark.parametrize("untied,modules", [(False, ()), (False, ("embed", "norms")), (True, ("embed", "norms"))])
def test_merged_export_and_peft_adapter_give_our_logits(tmp_path, tiny, untied, modules):
    """PEFT loads modules_to_save whole (a tied model's LM head too: PEFT unties it)."""
    peft = pytest.importorskip("peft", reason="peft is a test extra: pip install -e '.[test]'")
    config, base = tiny
    if untied:
        config = config.replace(tie_word_embeddings=False)
        base = qwen2.init_params(config, jax.random.key(0))
    settings = lora.LoraSettings(rank=4, alpha=8.0, modules_to_save=modules)
    ad = _random_adapters(settings, base)
    merged = lora.merge(settings, base, ad)
    ids = np.array([[3, 17, 200, 5, 99, 411]])
    ours = np.asarray(jax.jit(qwen2.forward, static_argnums=0)(config, merged, jnp.asarray(ids)))

    hf_io.save_pretrained(config, base, tmp_path / "base")
    hf_io.save_pretrained(config, merged, tmp_path / "merged")
    lora.save_peft_adapter(settings, config, ad, merged, tmp_path / "adapter", str(tmp_path / "base"))
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
    from rlver_jax.train.spec import RunSpec

    config = get_config("tiny")
    assert RunSpec.from_config(config).lora == lora.LoraSettings(rank=0, alpha=16.0, modules_to_save=("embed", "norms"))
    config.lora.targets = "q,v"
    config.lora.rank = -2
    with pytest.raises(ValueError, match=r"config.lora.rank=-2 must be >= 0"):
        RunSpec.from_config(config)
    config.lora.rank = 8
    config.critic.path = "/somewhere/critic"
    with pytest.raises(ValueError, match=r"config.critic.path='/somewhere/critic' with config.lora.rank=8"):
        RunSpec.from_config(config)
    assert lora.LoraSettings.from_config(config.lora).targets == ("q", "v")


def test_gradients_reach_only_the_adapters_by_the_chain_rule(tiny):
    """d/dA and d/dB of a loss through the trainer's adapted model (update.Frozen.model) equal the
    hand chain rule from d/dW: dA = scale * dW @ B^T, dB = scale * A^T @ dW (the gate kernel, [D, F])."""
    config, base = tiny
    settings = lora.LoraSettings(rank=4, alpha=8.0, targets=("gate",))
    ad = _random_adapters(settings, base)

    def loss(params):  # any smooth function of the kernels (a forward pass would only cost time)
        return jnp.sum(jnp.sin(params["layer_0"]["mlp"]["gate_kernel"] * 30.0)) + jnp.sum(
            params["layer_1"]["mlp"]["gate_kernel"] ** 2)

    g = jax.grad(lambda adapters: loss(update.Frozen(base, settings).model(config, adapters)))(ad)
    assert set(g) == {"layer_0", "layer_1"} and set(g["layer_0"]) == {"mlp"}
    merged = lora.merge(settings, base, ad)
    g_w = np.asarray(jax.grad(loss)(merged)["layer_0"]["mlp"]["gate_kernel"])
    a, b = (np.asarray(ad["layer_0"]["mlp"]["gate_kernel"][k]) for k in ("lora_a", "lora_b"))
    # entries up to ~60, sums of 64 fp32 products: atol at their rounding, not 1e-7
    np.testing.assert_allclose(g["layer_0"]["mlp"]["gate_kernel"]["lora_a"], 2.0 * g_w @ b.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g["layer_0"]["mlp"]["gate_kernel"]["lora_b"], 2.0 * a.T @ g_w, rtol=1e-4, atol=1e-4)


def _sgd():
    """Plain SGD at rate 1: a parameter's change is minus its gradient (Adam would normalise it away)."""
    return Optimizer(optax.sgd(1.0), optax.constant_schedule(1.0))


# The slow tier: PPO's two update programs took 35-70 s of the fast tier, GRPO's 16 s.
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_lora_train_step_is_the_chain_rule_of_the_full_one(algo):
    """One train step of the LoRA trainer against one of full fine-tuning from the same weights
    (plain SGD, a KL term to the reference): a fresh adapter (B = 0) leaves each model equal to its
    base, so the full step's kernel change dW = -g_W gives the adapters' by the chain rule in numpy,
    dB = scale * A^T dW and dA = scale * dW B^T = 0; the critic's value head moves as in full
    fine-tuning, and so does each leaf of modules_to_save (its delta's gradient is its own); the
    base, shared by the actor, the critic and the reference, is left as it was."""
    cfg = get_preset("tiny")
    base = qwen2.init_params(cfg, jax.random.key(0))
    base_copy = jax.tree.map(np.array, base)
    settings = lora.LoraSettings(rank=4, alpha=8.0, modules_to_save=("embed", "norms"))
    rl = RLSettings(algo=algo, mini_batch_size=4, micro_batch_size=2, kl_coef=0.1)
    critic_cfg = critic = None
    if rl.uses_critic:
        critic_cfg, critic = model_loading.critic_from_actor(cfg, base)
    full = train_state.init_train_state(jax.tree.map(jnp.copy, base), _sgd().tx, critic, critic and _sgd().tx)
    critic = jax.tree.map(np.array, critic)  # the update donates the state
    full_program = rl_program.make_update_program(rl, cfg, critic_cfg, _sgd(), critic and _sgd())
    full_after, full_metrics, _ = rl_program.train_on_batch(full_program, full, training_batch(),
                                                            jax.tree.map(jnp.copy, base))

    actor_ad = lora.init_adapters(settings, base, jax.random.key(1))
    critic_ad = None
    if rl.uses_critic:
        critic_ad = {**lora.init_adapters(settings, base, jax.random.key(2)), **model_loading.value_head(critic_cfg)}
    state = train_state.init_train_state(actor_ad, _sgd().tx, critic_ad, critic and _sgd().tx)
    actor_ad, critic_ad = jax.tree.map(np.array, (actor_ad, critic_ad))  # the update donates the state
    program = rl_program.make_update_program(rl, cfg, critic_cfg, _sgd(), critic and _sgd(), lora=settings)
    after, metrics, _ = rl_program.train_on_batch(program, state, training_batch(), base)

    jax.tree.map(np.testing.assert_array_equal, base, base_copy)
    np.testing.assert_allclose(metrics["kl_ref"], full_metrics["kl_ref"], rtol=1e-5, atol=1e-7)
    models = [("actor", full_after.actor, base, actor_ad, after.actor)]
    if rl.uses_critic:
        models.append(("critic", full_after.critic, critic, critic_ad, after.critic))
        for k in ("value_kernel", "value_bias"):
            np.testing.assert_allclose(after.critic[k], full_after.critic[k], rtol=1e-5, atol=1e-7)
    for name, full_params, start, ad, trained in models:
        assert set(trained) == set(ad), name  # only the trainable leaves: no base weights in the state
        for path in [("embed", "embedding"), ("final_norm", "scale"), ("layer_1", "post_attn_norm", "scale")]:
            get = lambda t, path=path: functools.reduce(lambda n, k: n[k], path, t)
            dw = np.asarray(get(full_params)) - np.asarray(get(start))
            assert name == "critic" or np.abs(dw).max() > 0, path  # a zero value head passes the critic no gradient
            ulp = np.finfo(np.float32).eps * np.abs(np.asarray(get(start))).max()  # dW's rounding (norms ~1)
            np.testing.assert_allclose(get(trained)["delta"], dw, rtol=1e-4, atol=ulp + 1e-5 * np.abs(dw).max())
        for t in settings.targets:
            module, kernel, _, _ = lora.TARGETS[t]
            for group in ("layer_0", "layer_1"):
                a = np.asarray(ad[group][module][kernel]["lora_a"])
                dw = np.asarray(full_params[group][module][kernel]) - np.asarray(start[group][module][kernel])
                a2 = a.reshape(-1, settings.rank)
                want = settings.scale * a2.T @ dw.reshape(a2.shape[0], -1)
                got = trained[group][module][kernel]
                np.testing.assert_array_equal(got["lora_a"], a)
                # dW is a difference of fp32 weights (~0.02): rounded at ~2e-9 each
                np.testing.assert_allclose(np.asarray(got["lora_b"]).reshape(want.shape), want,
                                           rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_lora_scales_the_learning_rates_by_its_multiplier():
    """config.lora.lr_multiplier x config.optim's rates with LoRA (after warmup), not without."""
    from configs.ppo_think import get_config
    from rlver_jax.train.abstract_run import make_optimizers
    from rlver_jax.train.spec import RunSpec

    config = get_config("tiny")
    full = make_optimizers(RunSpec.from_config(config))
    config.lora.rank = 8
    adapted = make_optimizers(RunSpec.from_config(config))
    for f, a, lr in zip(full, adapted, (config.optim.actor.lr, config.optim.critic.lr)):
        assert float(f.learning_rate(100)) == pytest.approx(lr)
        assert float(a.learning_rate(100)) == pytest.approx(10.0 * lr)
    # the adapter factors at lr x 10, every other trainable leaf (a delta, a value head) at lr
    config.lora.modules_to_save = "norms"
    tx = make_optimizers(RunSpec.from_config(config))[1].tx
    params = {"q": {"lora_a": jnp.ones(3), "lora_b": jnp.ones(3)}, "final_norm": {"scale": {"delta": jnp.zeros(3)}},
              "value_kernel": jnp.zeros(3)}
    updates, _ = tx.update(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
    adam = -1.0 / (1.0 + 1e-8 / np.sqrt(0.001))  # Adam's first step from m = g = 1 (bias-corrected)
    np.testing.assert_allclose(updates["final_norm"]["scale"]["delta"], 0.1 * adam, rtol=1e-5)
    np.testing.assert_allclose(updates["value_kernel"], 0.1 * adam, rtol=1e-5)
    wd = config.optim.critic.weight_decay
    np.testing.assert_allclose(updates["q"]["lora_a"], adam - wd, rtol=1e-5)  # AdamW's decay at unit weights
    config.lora.lr_multiplier = 0.0
    with pytest.raises(ValueError, match=r"config.lora.lr_multiplier=0.0 must be > 0"):
        RunSpec.from_config(config)


def test_sampler_benchmark_runs_both_forms_and_they_agree():
    """benchmarks/lora_sampler.py at tiny shapes: it checks the unmerged projections against the
    merged ones (exits non-zero when they differ) and prints its table."""
    proc = run_script("benchmarks/lora_sampler.py", "--preset=tiny", "--rank=4", "--rows=2", "--repeats=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| 2 | " in proc.stdout and "merge of the layer's adapters" in proc.stdout

"""train/ablation.py: what a run changes from its preset, which overrides the preset makes no-ops,
and the reasons behind the no-ops checked on the maths itself (numpy references)."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlver_jax.rl import advantages as adv_lib
from rlver_jax.rl import losses, policy_losses
from rlver_jax.rl.settings import RLSettings
from rlver_jax.train import ablation
from rlver_jax.train.spec import RunSpec

grpo_think = importlib.import_module("configs.grpo_think")
ppo_nothink = importlib.import_module("configs.ppo_nothink")


def _spec(module, preset, **overrides):
    config, base = module.get_config(preset), module.get_config(preset)
    with config.unlocked():
        for dotted, value in overrides.items():
            section, _, field = dotted.rpartition(".")
            node = config
            for part in filter(None, section.split(".")):
                node = node[part]
            node[field] = value
    spec = RunSpec.from_config(config, preset=base)
    changed = ablation.changed_fields(spec.record, spec.preset)
    return spec, changed, ablation.no_ops(spec, changed)


def test_the_preset_alone_changes_nothing():
    spec, changed, noop = _spec(grpo_think, "tiny")
    assert changed == {} and noop == {}
    assert ablation.banner_lines(changed, noop) == ["ablation   none: the preset as it is"]


def test_where_and_how_a_run_is_kept_is_not_an_ablation():
    _, changed, _ = _spec(grpo_think, "tiny", **{"workdir": "/tmp/elsewhere", "train.eval_every": 3,
                                               "rl.kl_coef": 0.01})
    assert changed == {"rl.kl_coef": (0.0, 0.01)}


def test_the_tiny_think_preset_makes_per_turn_reward_and_gspo_no_ops():
    spec, changed, noop = _spec(grpo_think, "tiny", **{"rl.reward_mode": "per_turn", "rl.algo": "gspo",
                                                     "rl.clip_eps_low": 0.1})
    assert set(changed) == {"rl.reward_mode", "rl.algo", "rl.clip_eps_low"}
    assert set(noop) == set(changed)
    assert "one-turn dialogues" in noop["rl.reward_mode"]
    assert "every PPO ratio is 1" in noop["rl.algo"] and "every PPO ratio is 1" in noop["rl.clip_eps_low"]
    lines = ablation.banner_lines(changed, noop)
    assert lines[1].startswith("no-op      rl.algo='gspo' changes nothing here: grpo and gspo differ only")


def test_a_multi_turn_critic_run_keeps_its_ablations():
    """ppo_nothink tiny: three turns and a critic, so the per-turn reward moves GAE; dapo changes the
    estimator's knobs, not only the loss."""
    _, changed, noop = _spec(ppo_nothink, "tiny", **{"rl.reward_mode": "per_turn"})
    assert changed == {"rl.reward_mode": ("final", "per_turn")} and noop == {}
    _, changed, noop = _spec(grpo_think, "tiny", **{"rl.algo": "dapo"})
    assert "rl.algo" in changed and "rl.algo" not in noop


def test_two_epochs_keep_the_clip():
    _, changed, noop = _spec(grpo_think, "tiny", **{"rl.ppo_epochs": 2, "rl.clip_eps_low": 0.1})
    assert "rl.clip_eps_low" in changed and noop == {}


def test_group_baseline_removes_the_per_turn_constant():
    """One turn: per_turn reward = (final - initial) / 100 = final / 100 - a constant; GRPO's
    advantages (std-normalised or not) and RLOO's are the same for both (numpy reference)."""
    rng = np.random.default_rng(0)
    final = rng.integers(0, 100, size=8).astype(np.float32)
    groups = np.repeat(np.arange(2), 4)

    def grpo_ref(scores, std):
        out = np.empty_like(scores)
        for g in np.unique(groups):
            s = scores[groups == g]
            out[groups == g] = (s - s.mean()) / ((s.std(ddof=1) + 1e-6) if std else 1.0)
        return out

    for std in (True, False):
        a = grpo_ref(final / 100, std)
        b = grpo_ref((final - 40) / 100, std)
        np.testing.assert_allclose(a, b, atol=1e-5)
        ours = adv_lib.grpo_advantages(jnp.asarray((final - 40) / 100), jnp.asarray(groups), 8,
                                       normalize_std=std, eps=1e-6)
        np.testing.assert_allclose(np.asarray(ours), a, atol=1e-5)


@pytest.mark.parametrize("loss", ["gspo", "gspo_token", "cispo"])
def test_at_ratio_one_the_losses_give_ppos_gradient(loss):
    """With log pi == log pi_old every loss's gradient (seq_mean_token_mean) is the plain policy
    gradient, -mean_b mean_t A: checked against that hand formula."""
    rng = np.random.default_rng(1)
    lp = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
    mask = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], jnp.float32)
    adv = jnp.asarray(np.repeat(rng.normal(size=(3, 1)), 5, axis=1), jnp.float32)  # one per dialogue
    rl = RLSettings(algo="grpo")

    def total(fn, x):
        per_token, _ = fn(rl, x, jax.lax.stop_gradient(lp), adv, mask)
        return losses.aggregate_loss(per_token, mask, "seq_mean_token_mean")

    expected = -np.asarray(adv * mask / mask.sum(-1, keepdims=True)) / 3
    for fn in (policy_losses.ppo, getattr(policy_losses, loss)):
        np.testing.assert_allclose(np.asarray(jax.grad(lambda x: total(fn, x))(lp)), expected, rtol=1e-5, atol=1e-7)

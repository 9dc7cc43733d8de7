"""The PPO/GRPO update: batching, reward placement, accumulation, and the direction of learning."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlver_jax.models import qwen2
from rlver_jax.models.config import get_preset
from rlver_jax.rl import trainer
from rlver_jax.rl.batch import collate, policy_positions
from rlver_jax.rollout.sequence import DialogueSequence


def _dialogue(rng, group, emotions, n_turns=2, ctx=5, turn=4, format_failure=False):
    """Tokens: [ctx user tokens][turn policy tokens] repeated n_turns times."""
    tokens, mask, ends = [], [], []
    for _ in range(n_turns):
        tokens += list(rng.integers(1, 500, ctx)); mask += [0] * ctx
        tokens += list(rng.integers(1, 500, turn)); mask += [1] * turn
        ends.append(len(tokens) - 1)
    return DialogueSequence(
        profile_id=f"p{group}", group=group, tokens=tokens, policy_mask=mask,
        logprobs=[0.0] * len(tokens), turn_ends=ends, emotions=emotions, end_reason="turn_limit",
        format_failure=format_failure)


def _setup(algo, micro, lr=1e-2, epochs=1, sgd=False):
    cfg = get_preset("tiny")
    actor = qwen2.init_params(cfg, jax.random.key(0))
    rl = trainer.RLSettings(algo=algo, mini_batch_size=4, micro_batch_size=micro, ppo_epochs=epochs)
    opt = trainer.OptimSettings(lr=lr, warmup_ratio=0.0, weight_decay=0.0)
    # Plain SGD makes the parameter change the gradient itself (Adam would normalise it away).
    make_tx = (lambda: optax.sgd(lr)) if sgd else (lambda: trainer.make_optimizer(opt, 10))
    actor_tx = make_tx()
    critic_cfg, critic, critic_tx = None, None, None
    if rl.uses_critic:
        critic_cfg, critic = trainer.critic_from_actor(cfg, actor)
        critic_tx = make_tx()
    state = trainer.init_train_state(actor, actor_tx, critic, critic_tx, seed=0)
    fns = trainer.make_update_fns(rl, cfg, critic_cfg, actor_tx, critic_tx)
    return cfg, state, fns


def _batch():
    rng = np.random.default_rng(1)
    seqs = [_dialogue(rng, 0, [30.0, 60.0, 90.0]), _dialogue(rng, 0, [30.0, 20.0, 5.0]),
            _dialogue(rng, 1, [30.0, 40.0, 70.0]), _dialogue(rng, 1, [30.0, 10.0, 0.0])]
    return collate(seqs, batch_size=4, reward_mode="final", length_multiple=8)


def _policy_logprob(cfg, params, batch):
    lp = trainer.token_logprobs(cfg, params, jnp.asarray(batch.tokens), jnp.asarray(batch.attention_mask))
    return np.asarray((lp * batch.policy_mask).sum(-1))


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_update_raises_logprob_of_rewarded_dialogues(algo):
    cfg, state, fns = _setup(algo, micro=2)
    batch = _batch()
    before = _policy_logprob(cfg, state.actor, batch)
    state, metrics = trainer.train_on_batch(fns, state, batch)
    after = _policy_logprob(cfg, state.actor, batch)
    assert int(state.step) == 1 and all(np.isfinite(v) for v in metrics.values())
    # Within each group the better dialogue gains probability and the worse one loses it.
    delta = after - before
    assert delta[0] > 0 > delta[1] and delta[2] > 0 > delta[3]
    if algo == "ppo":
        assert "value_loss" in metrics and metrics["critic_grad_norm"] > 0


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_microbatch_accumulation_is_exact(algo):
    batch = _batch()
    results = []
    for micro in (4, 2, 1):
        _, state, fns = _setup(algo, micro=micro, lr=1.0, sgd=True)
        state, _ = trainer.train_on_batch(fns, state, batch)
        results.append((state.actor, state.critic))
    for other in results[1:]:
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), results[0], other)


def test_settings_errors_name_the_field():
    with pytest.raises(ValueError, match="config.rl.algo"):
        trainer.RLSettings(algo="dpo")
    with pytest.raises(ValueError, match="config.rl.micro_batch_size"):
        trainer.RLSettings(mini_batch_size=6, micro_batch_size=4)


def test_token_logprobs_value_and_gradient_match_plain_log_softmax():
    """The custom-VJP head (no [B, T, V] log-softmax kept) against autodiff of the textbook form."""
    cfg = get_preset("tiny")
    params = qwen2.init_params(cfg, jax.random.key(3))
    rng = np.random.default_rng(3)
    tokens = jnp.asarray(rng.integers(1, cfg.vocab_size, (3, 12)), jnp.int32)
    mask = jnp.asarray(np.arange(12)[None, :] >= np.array([[0], [4], [1]]), jnp.int32)  # left padding
    w_lp, w_ent = (jnp.asarray(rng.normal(size=(3, 12)), jnp.float32) for _ in range(2))

    def ours(p):
        lp, ent = trainer.token_logprobs(cfg, p, tokens, mask, with_entropy=True)
        return jnp.sum(w_lp * lp + w_ent * ent)

    def reference(p):
        logp = jax.nn.log_softmax(qwen2.forward(cfg, p, tokens, mask)[:, :-1], axis=-1)
        lp = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
        return jnp.sum(w_lp[:, 1:] * lp + w_ent[:, 1:] * ent)

    (v1, g1), (v2, g2) = jax.value_and_grad(ours)(params), jax.value_and_grad(reference)(params)
    np.testing.assert_allclose(v1, v2, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4), g1, g2)


def test_token_logprobs_at_policy_positions_match_the_full_head():
    cfg = get_preset("tiny")
    params = qwen2.init_params(cfg, jax.random.key(4))
    batch = _batch()
    tokens, attn = jnp.asarray(batch.tokens), jnp.asarray(batch.attention_mask)
    mask = batch.policy_mask
    positions = jnp.asarray(policy_positions(mask))
    assert positions.shape[1] < tokens.shape[1]

    def masked_sum(p, pos):
        lp, ent = trainer.token_logprobs(cfg, p, tokens, attn, with_entropy=True, positions=pos)
        return jnp.sum((lp + 0.3 * ent) * mask), (lp, ent)

    (v_full, (lp_full, ent_full)), g_full = jax.value_and_grad(masked_sum, has_aux=True)(params, None)
    (v_sel, (lp_sel, ent_sel)), g_sel = jax.value_and_grad(masked_sum, has_aux=True)(params, positions)
    np.testing.assert_allclose(v_sel, v_full, rtol=1e-6)
    np.testing.assert_allclose(lp_sel, np.asarray(lp_full) * mask, atol=1e-6)
    np.testing.assert_allclose(ent_sel, np.asarray(ent_full) * mask, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), g_sel, g_full)

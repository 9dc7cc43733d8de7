"""The PPO/GRPO update: batching, reward placement, accumulation, and the direction of learning."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlver_jax.models import qwen2
from rlver_jax.models.config import get_preset
from rlver_jax.parallel import sharding
from rlver_jax.parallel.sampling_copy import SamplingLayout
from rlver_jax.rl import offload, train_state, update
from rlver_jax.rl import program as rl_program
from rlver_jax.rl.batch import collate
from rlver_jax.rl.logprobs import token_logprobs, token_values
from rlver_jax.rl.optimizer import Optimizer, make_optimizer
from rlver_jax.rl.settings import OptimSettings, RLSettings
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.train import model_loading
from tests import verl_reference
from tests.rl_helpers import dialogue, score


def _setup(algo, micro, lr=1e-2, epochs=1, sgd=False, **rl_fields):
    cfg = get_preset("tiny")
    actor = qwen2.init_params(cfg, jax.random.key(0))
    rl = RLSettings(algo=algo, mini_batch_size=4, micro_batch_size=micro, ppo_epochs=epochs, **rl_fields)
    opt = OptimSettings(lr=lr, warmup_ratio=0.0, weight_decay=0.0)
    # Plain SGD makes the parameter change the gradient itself (Adam would normalise it away).
    make_opt = ((lambda: Optimizer(optax.sgd(1.0), optax.constant_schedule(lr))) if sgd
                else (lambda: make_optimizer(opt, 10)))
    actor_opt = make_opt()
    critic_cfg, critic, critic_opt = None, None, None
    if rl.uses_critic:
        critic_cfg, critic = model_loading.critic_from_actor(cfg, actor)
        critic_opt = make_opt()
    state = train_state.init_train_state(actor, actor_opt.tx, critic, critic_opt and critic_opt.tx, seed=0)
    program = rl_program.make_update_program(rl, cfg, critic_cfg, actor_opt, critic_opt)
    return cfg, state, program


def _batch():
    rng = np.random.default_rng(1)
    seqs = [dialogue(rng, 0, [30.0, 60.0, 90.0]), dialogue(rng, 0, [30.0, 20.0, 5.0]),
            dialogue(rng, 1, [30.0, 40.0, 70.0]), dialogue(rng, 1, [30.0, 10.0, 0.0])]
    return collate(seqs, batch_size=4, length_multiple=8)


def _policy_logprob(cfg, params, batch):
    lp = token_logprobs(cfg, params, jnp.asarray(batch.tokens), jnp.asarray(batch.attention_mask))
    return np.asarray((lp * batch.policy_mask).sum(-1))


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_update_raises_logprob_of_rewarded_dialogues(algo):
    cfg, state, program = _setup(algo, micro=2)
    batch = _batch()
    before = _policy_logprob(cfg, state.actor, batch)
    state, metrics, _ = rl_program.train_on_batch(program, state, batch)
    after = _policy_logprob(cfg, state.actor, batch)
    assert int(state.step) == 1 and all(np.isfinite(v) for v in metrics.values())
    # Within each group the better dialogue gains probability and the worse one loses it.
    delta = after - before
    assert delta[0] > 0 > delta[1] and delta[2] > 0 > delta[3]
    if algo == "ppo":
        assert "value_loss" in metrics and metrics["critic_grad_norm"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_microbatch_accumulation_is_exact(algo):
    """One micro-batch of 4 rows and four of 1, accumulated: the same update."""
    batch = _batch()
    results = []
    for micro in (4, 1):
        _, state, program = _setup(algo, micro=micro, lr=1.0, sgd=True)
        state, _, _ = rl_program.train_on_batch(program, state, batch)
        results.append((state.actor, state.critic))
    for other in results[1:]:
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), results[0], other)


@pytest.mark.slow
def test_grpo_dialogue_advantages_are_the_group_normalised_rewards():
    """train_on_batch hands back each dialogue's advantage (for the transcripts) by its dialogue
    id: with GRPO the dialogue's reward normalised within its group, in plain numpy; the ids past
    the dialogues' (padding rows') hold 0."""
    rng = np.random.default_rng(2)
    finals = [90.0, 5.0, 70.0, 0.0]
    seqs = [dialogue(rng, 0, [30.0, 50.0, f]) for f in finals]
    _, state, program = _setup("grpo", micro=2)
    state, _, advantages = rl_program.train_on_batch(program, state, collate(seqs, batch_size=4, length_multiple=8))
    r = np.array(finals) / 100
    assert advantages.shape == (8,)
    np.testing.assert_allclose(advantages[:4], (r - r.mean()) / (r.std(ddof=1) + 1e-6), rtol=1e-5)
    np.testing.assert_array_equal(advantages[4:], 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tis", "mis", "icepop"])
def test_the_off_policy_correction_reaches_the_policy_loss(mode):
    """A GRPO step on sampling log-probs away from the actor's: at its one optimizer step the PPO
    ratio is 1, so the policy loss (token mean) is -sum(w A) / sum(m) over the kept tokens m, with w
    and m from the numpy transcriptions of verl's rollout correction and IcePop; the off-policy
    metrics are the batch's."""
    cfg, state, program = _setup("grpo", micro=2, loss_agg_mode="token_mean", off_policy_correction=mode)
    batch = _batch()
    mask = batch.policy_mask
    old = np.asarray(token_logprobs(cfg, state.actor, jnp.asarray(batch.tokens), jnp.asarray(batch.attention_mask)))
    rng = np.random.default_rng(7)
    batch.sample_logprobs[:] = np.where(mask > 0, old + rng.normal(size=mask.shape) * 0.8, 0.0)
    _, metrics, advantages = rl_program.train_on_batch(program, state, batch)
    a = advantages[batch.dialogue][:, None] * mask
    kept, w = mask, np.ones_like(mask)
    if mode == "mis":
        kept = verl_reference.rollout_rs_mask(old, batch.sample_logprobs, mask, "token", 0.5, 2.0)
    elif mode == "tis":
        w = verl_reference.rollout_is_weights(old, batch.sample_logprobs, mask, "token", 2.0)[0]
    else:
        w = verl_reference.icepop_weights(old, batch.sample_logprobs, mask, 0.5, 5.0)
    cut_or_dropped = ((w * kept == 0) | (w == 2.0))[mask > 0]  # tis truncates at 2.0
    assert 0 < cut_or_dropped.mean() < 1
    np.testing.assert_allclose(metrics["policy_loss"], -(w * a * kept).sum() / kept.sum(), rtol=1e-4, atol=1e-6)
    ratio = verl_reference.rollout_ratios(old, batch.sample_logprobs, mask, "token")[mask > 0]
    np.testing.assert_allclose(metrics["offpolicy_weight_mean"], ratio.mean(), rtol=1e-4)
    np.testing.assert_allclose(metrics["offpolicy_weight_max"], ratio.max(), rtol=1e-4)


def test_settings_errors_name_the_field():
    with pytest.raises(ValueError, match="config.rl.algo"):
        RLSettings(algo="dpo")
    with pytest.raises(ValueError, match="config.rl.micro_batch_size"):
        RLSettings(mini_batch_size=6, micro_batch_size=4)


def _placed_setup(mesh, rl, opt, offload="none"):
    """A tiny actor (and critic) and their state on `mesh`, as rlver_jax.train.run builds them."""
    cfg = get_preset("tiny")
    actor_sh = sharding.param_shardings(cfg, mesh, "fsdp_tensor")
    actor = sharding.init_sharded_params(cfg, jax.random.key(0), shardings=actor_sh)
    actor_opt = make_optimizer(opt, 10)
    critic_cfg = critic = critic_opt = critic_sh = None
    if rl.uses_critic:
        critic_cfg, critic = model_loading.critic_from_actor(cfg, actor)
        critic_sh = sharding.param_shardings(critic_cfg, mesh, "fsdp_tensor")
        critic, critic_opt = jax.device_put(critic, critic_sh), make_optimizer(opt, 10)
    critic_tx = critic_opt and critic_opt.tx
    state_sh = train_state.state_shardings(actor_opt.tx, actor, actor_sh, critic_tx, critic, critic_sh)
    state = train_state.init_train_state(actor, actor_opt.tx, critic, critic_tx, seed=0, shardings=state_sh)
    return state, rl_program.make_update_program(rl, cfg, critic_cfg, actor_opt, critic_opt, mesh, state_sh,
                                                 offload=offload)


@pytest.mark.slow
def test_train_step_compiles_once_and_stays_on_the_device(monkeypatch):
    """Two steps on the mesh (two epochs of two mini-batches each): one trace of each jitted
    program (prepare; the actor's and the critic's epochs), and the second step moves nothing
    between host and device but the batch (placed explicitly) and the metrics (fetched explicitly)."""
    monkeypatch.setattr(rl_program, "prepare_step", chex.assert_max_traces(update.prepare_step, n=1))
    monkeypatch.setattr(rl_program, "model_epochs", chex.assert_max_traces(update.model_epochs, n=2))
    rl = RLSettings(algo="ppo", mini_batch_size=2, micro_batch_size=1, ppo_epochs=2)
    state, program = _placed_setup(sharding.make_mesh((1, 2, 4)), rl, OptimSettings(lr=1e-3))
    state, _, _ = rl_program.train_on_batch(program, state, _batch())
    with jax.transfer_guard("disallow"):
        state, metrics, _ = rl_program.train_on_batch(program, state, _batch())
    assert int(jax.device_get(state.step)) == 2 and all(np.isfinite(v) for v in metrics.values())


# Where each part of a PPO state is when each program runs and after the step (by hand, from the
# modes' descriptions in configs/base.py): D device memory, H host memory; parts in the order
# actor, actor_opt, critic, critic_opt.
_PLACES = {
    "idle": {"prepare": "DDDD", "actor": "DDHH", "critic": "HHDD", "after": "DDDD"},
    "state": {"prepare": "DHDH", "actor": "DDHH", "critic": "HHDD", "after": "HHHH"},
}


@pytest.mark.slow
def test_offload_moves_parts_and_changes_nothing(monkeypatch):
    """train.offload: each program runs with the state's parts where the mode puts them, and two
    PPO steps give bit for bit the parameters, AdamW states and metrics of keeping everything on
    the devices. The state then rests where the mode says (in host memory for "state") and the
    sampling copy is made from there."""
    rl = RLSettings(algo="ppo", mini_batch_size=2, micro_batch_size=1)
    mesh = sharding.make_mesh((1, 2, 4))
    seen = []
    results = {}
    for mode in ("none", *_PLACES):
        state, program = _placed_setup(mesh, rl, OptimSettings(lr=1e-2), mode)

        def where(st):
            return "".join("H" if jax.tree.leaves(getattr(st, p))[0].sharding.memory_kind == "pinned_host" else "D"
                           for p in ("actor", "actor_opt", "critic", "critic_opt"))

        def watch(name, fn):
            def run(*args):
                seen.append((name, where(current[0])))
                return fn(*args)
            return run

        current = [state]
        place = offload.place

        def tracked_place(*args):
            current[0] = place(*args)
            return current[0]

        monkeypatch.setattr(offload, "place", tracked_place)
        program = dataclasses.replace(program, prepare=watch("prepare", program.prepare),
                                  actor=watch("actor", program.actor), critic=watch("critic", program.critic))
        seen.clear()
        for _ in range(2):
            state, metrics, _ = rl_program.train_on_batch(program, state, _batch())
            seen.append(("after", where(state)))
        results[mode] = (jax.device_get(state), metrics, list(seen))
        monkeypatch.setattr(offload, "place", place)
    assert all(w == "DDDD" for _, w in results["none"][2])
    for mode, places in _PLACES.items():
        assert results[mode][2] == [(stage, places[stage]) for stage in ("prepare", "actor", "critic", "after")] * 2
        jax.tree.map(np.testing.assert_array_equal, results["none"][0], results[mode][0])
        assert results["none"][1] == results[mode][1]
    # `state` is the last mode run: its state rests in host memory, and the sampler copies from there.
    layout = SamplingLayout.create(get_preset("tiny"), mesh, "fsdp_tensor")
    copy = layout.copy(state.actor)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(copy), results["none"][0].actor)
    with pytest.raises(ValueError, match="config.train.offload"):
        _placed_setup(mesh, rl, OptimSettings(), "all")


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_norm_and_learning_rate_metrics_match_numpy(algo):
    """One mini-batch per step: the update norm is |new - old|, the parameter norm |new|, and
    the learning rate follows the warmup by hand: lr 1e-2, 10 steps, warmup ratio 0.5 -> 5
    warmup steps from lr / 5 to lr: 2e-3 at the first step, 4e-3 at the second."""
    rl = RLSettings(algo=algo, mini_batch_size=4, micro_batch_size=2)
    opt = OptimSettings(lr=1e-2, warmup_ratio=0.5)
    state, program = _placed_setup(sharding.make_mesh((1, 4, 2)), rl, opt)
    models = ("actor", "critic") if algo == "ppo" else ("actor",)

    def norm(tree):
        return np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(tree)))

    for expected_lr in (2e-3, 4e-3):
        old = {m: jax.device_get(getattr(state, m)) for m in models}  # host copies: the step donates
        state, metrics, _ = rl_program.train_on_batch(program, state, _batch())
        for m in models:
            new = jax.device_get(getattr(state, m))
            assert metrics[f"{m}_update_norm"] == pytest.approx(norm(jax.tree.map(np.subtract, new, old[m])), rel=1e-4)
            assert metrics[f"{m}_param_norm"] == pytest.approx(norm(new), rel=1e-5)
            assert metrics[f"{m}_lr"] == pytest.approx(expected_lr, rel=1e-6)
    assert ("critic_lr" in metrics) == (algo == "ppo")


def test_step_keys_are_a_function_of_the_run_key_and_the_step():
    rng = train_state.seed_keys(0).run
    a, b = train_state.step_keys(rng, 3), train_state.step_keys(rng, 4)
    np.testing.assert_array_equal(a.rollout, train_state.step_keys(np.asarray(rng), 3).rollout)  # host or device
    keys = [np.asarray(k).tolist() for k in (*a, *b, train_state.seed_keys(0).init, rng)]
    assert len({tuple(k) for k in keys}) == len(keys)  # every stream and step draws apart
    rows = np.asarray(update.minibatch_rows(RLSettings(mini_batch_size=2, micro_batch_size=1, ppo_epochs=3),
                                             a.order, 6))
    assert rows.shape == (9, 2)
    for epoch in rows.reshape(3, 3, 2):  # each epoch visits every row once, sorted within a mini-batch
        assert sorted(epoch.ravel().tolist()) == list(range(6)) and (np.diff(epoch, axis=1) > 0).all()


def _turn_rowsdialogue(rng, group, emotions, n_turns):
    """think_history "drop": one row per turn ([ctx user tokens][turn policy tokens])."""
    seq = dialogue(rng, group, emotions, n_turns=1)
    tokens, mask, ends, starts = [], [], [], []
    for _ in range(n_turns):
        starts.append(len(tokens))
        tokens += seq.tokens
        mask += seq.policy_mask
        ends.append(len(tokens) - 1)
    return score(DialogueSequence(profile_id=seq.profile_id, group=group, tokens=tokens, policy_mask=mask,
                                  logprobs=[0.0] * len(tokens), turn_ends=ends, emotions=emotions,
                                  end_reason="turn_limit", row_starts=starts), "final")


def test_grpo_on_turn_rows_normalises_over_dialogues():
    """Turn rows of 4 dialogues (3, 1, 2 and 2 rows; 8 rows, padded to 8 for 4 slots): every row
    gets its dialogue's group-normalised reward. Group 0: rewards 0.9 and 0.1 -> +-0.7071 (sample
    std 0.5657), whatever their row counts; group 1: 0.7 and 0.7 -> 0. A train step cuts the 8
    rows into the 2 mini-batches of 2 dialogues each (4 rows)."""
    rng = np.random.default_rng(3)
    seqs = [_turn_rowsdialogue(rng, 0, [30.0, 90.0], 3), _turn_rowsdialogue(rng, 0, [30.0, 10.0], 1),
            _turn_rowsdialogue(rng, 1, [30.0, 70.0], 2), _turn_rowsdialogue(rng, 1, [30.0, 70.0], 2)]
    batch = collate(seqs, batch_size=4, length_multiple=8)
    assert batch.tokens.shape[0] == 8 and batch.dialogue.tolist() == [0, 0, 0, 1, 2, 2, 3, 3]
    cfg = get_preset("tiny")
    actor = qwen2.init_params(cfg, jax.random.key(0))
    rl = RLSettings(algo="grpo", mini_batch_size=2, micro_batch_size=1, batch_size=4)
    state = train_state.init_train_state(actor, optax.sgd(0.0), seed=0)
    arrays = {k: jnp.asarray(v) for k, v in batch.arrays().items()}
    out, _ = update.prepare(rl, cfg, None, state, update.Frozen(), arrays)
    a = 0.4 / np.sqrt(0.32)
    row_adv = np.asarray(out["advantages"]).sum(-1) / np.maximum(batch.policy_mask.sum(-1), 1)
    np.testing.assert_allclose(row_adv, [a, a, a, -a, 0, 0, 0, 0], atol=1e-5)
    assert update.minibatch_rows(rl, jax.random.key(1), 8).shape == (2, 4)
    opt = Optimizer(optax.sgd(1.0), optax.constant_schedule(1e-2))
    program = rl_program.make_update_program(rl, cfg, None, opt, None)
    state = train_state.init_train_state(actor, opt.tx, seed=0)
    state, metrics, advantages = rl_program.train_on_batch(program, state, batch)
    assert int(state.step) == 1 and np.isfinite(metrics["policy_loss"])
    np.testing.assert_allclose(advantages[:4], [a, -a, 0, 0], atol=1e-5)  # a dialogue's, whatever its rows
    with pytest.raises(ValueError, match="and of the 4 dialogues per step"):
        rl_program.train_on_batch(program, state, collate(seqs[:1], batch_size=3, length_multiple=8))
def test_value_head_init_and_the_critic_loss_aggregation():
    """config.critic.value_head_init="normal": the head as transformers initialises the reference's
    token-classification head (kernel ~ N(0, initializer_range^2), zero bias), the body the actor's;
    rl.value_loss_agg_mode picks the critic's mini-batch weights (numpy: per-row token means
    averaged over rows, or one mean over all tokens)."""
    cfg = get_preset("tiny")
    actor = qwen2.init_params(cfg, jax.random.key(7))
    _, zero = model_loading.critic_from_actor(cfg, actor)
    _, normal = model_loading.critic_from_actor(cfg, actor, "normal", jax.random.key(3))
    assert not np.any(np.asarray(zero["value_kernel"])) and float(normal["value_bias"]) == 0.0
    assert abs(float(np.std(np.asarray(normal["value_kernel"]))) / cfg.initializer_range - 1) < 0.3
    jax.tree.map(np.testing.assert_array_equal, {k: v for k, v in normal.items() if not k.startswith("value_")},
                 {k: v for k, v in zero.items() if not k.startswith("value_")})
    with pytest.raises(ValueError, match="config.critic.value_head_init='xavier'"):
        model_loading.critic_from_actor(cfg, actor, "xavier")

    mask = np.zeros((4, 6), np.float32)
    for row, n in enumerate((1, 2, 3, 6)):
        mask[row, :n] = 1
    batch = {"policy_mask": jnp.asarray(mask), "tokens": jnp.zeros((4, 6), jnp.int32)}
    rows = jnp.arange(4)
    expected = {"seq_mean_token_mean": mask / mask.sum(1, keepdims=True) / 4, "token_mean": mask / mask.sum()}
    for mode, want in expected.items():
        rl = RLSettings(value_loss_agg_mode=mode, mini_batch_size=4, micro_batch_size=4)
        got = update.micro_batches(rl, batch, rows)["value_weights"]
        np.testing.assert_allclose(np.asarray(got).reshape(4, 6), want, rtol=1e-6)
    with pytest.raises(ValueError, match="config.rl.value_loss_agg_mode='row_mean'"):
        RLSettings(value_loss_agg_mode="row_mean")


def test_critic_has_no_lm_head_and_the_values_of_a_headed_critic():
    """The critic built from an untied actor keeps no vocabulary projection, in its parameters or
    its optimizer state, and its values are the actor's last hidden state through the value head,
    as a critic that carried the LM head computed them (numpy reference)."""
    cfg = get_preset("tiny", tie_word_embeddings=False)
    actor = qwen2.init_params(cfg, jax.random.key(7))
    critic_cfg, critic = model_loading.critic_from_actor(cfg, actor)
    assert "lm_head" in actor and "lm_head" not in critic
    assert critic_cfg.num_params() == cfg.num_params() - cfg.vocab_size * cfg.hidden_size
    assert jax.tree.structure(critic) == jax.tree.structure(qwen2.abstract_params(critic_cfg))
    opt = make_optimizer(OptimSettings(), 10)
    state = train_state.init_train_state(actor, opt.tx, critic, opt.tx)
    vocab_leaves = [x.shape for x in jax.tree.leaves((state.critic, state.critic_opt)) if cfg.vocab_size in x.shape]
    assert vocab_leaves == [(cfg.vocab_size, cfg.hidden_size)] * 3  # the input embedding, its two AdamW moments
    rng = np.random.default_rng(7)
    critic["value_kernel"] = jnp.asarray(rng.normal(size=cfg.hidden_size), jnp.float32)
    critic["value_bias"] = jnp.asarray(0.3, jnp.float32)
    tokens = jnp.asarray(rng.integers(1, cfg.vocab_size, (2, 9)), jnp.int32)
    attn = jnp.asarray(np.arange(9)[None, :] < np.array([[9], [6]]), jnp.int32)
    h, _ = qwen2.hidden_states(cfg, actor, tokens, attn)  # the headed model's last hidden state
    v = np.asarray(h, np.float64) @ np.asarray(critic["value_kernel"], np.float64) + 0.3
    expected = np.pad(v[:, :-1], ((0, 0), (1, 0)))  # V(state before token t)
    values = np.asarray(token_values(critic_cfg, critic, tokens, attn))
    np.testing.assert_allclose(values[attn.astype(bool)], expected[attn.astype(bool)], atol=1e-5)
    with pytest.raises(ValueError, match="no LM head"):
        qwen2.logits_from_hidden(critic_cfg, critic, h)


def test_minibatch_rows_put_padding_last():
    rl = RLSettings(mini_batch_size=2, micro_batch_size=1, ppo_epochs=2)
    padding = jnp.array([False, True, False, False, True, False])
    rows = np.asarray(update.minibatch_rows(rl, train_state.step_keys(train_state.seed_keys(0).run, 0).order, 6,
                                            padding))
    for epoch in rows.reshape(2, 3, 2):  # the four real rows fill the first two mini-batches
        assert sorted(epoch[:2].ravel().tolist()) == [0, 2, 3, 5] and sorted(epoch[2].tolist()) == [1, 4]


def test_optimizer_steps_count_row_mini_batches_and_skip_padding_only_ones():
    """3 rows, mini-batches of 2 rows, the batch padded to 6 rows (as a multi-host batch may be): ceil(3 / 2)
    = 2 optimizer steps; the third mini-batch holds padding only and is skipped."""
    cfg, state, program = _setup("grpo", micro=1, lr=1e-2)
    program = dataclasses.replace(program, rl=dataclasses.replace(program.rl, mini_batch_size=2))
    program = rl_program.make_update_program(program.rl, cfg, None, program.actor_opt, None)
    rng = np.random.default_rng(1)
    seqs = [dialogue(rng, 0, [30.0, 60.0]), dialogue(rng, 0, [30.0, 20.0]), dialogue(rng, 0, [30.0, 40.0])]
    _, metrics, _ = rl_program.train_on_batch(program, state, collate(seqs, batch_size=4, length_multiple=8,
                                                                   rows=6, row_multiple=2))
    assert metrics["optimizer_steps"] == 2.0


# Three groups of four one-row dialogues (two turns each, 3-5 policy tokens a turn); group 2's
# rewards are all equal.
_FINALS = [90.0, 5.0, 70.0, 0.0, 60.0, 20.0, 20.0, 35.0, 40.0, 40.0, 40.0, 40.0]
_TURN = [3 + d % 3 for d in range(12)]


def _overlong(length, budget=5, buffer=2):
    return -min(max((length - (budget - buffer)) / buffer, 0.0), 1.0)


def _whitened_by_tokens(values, tokens):
    """Each dialogue's value whitened over the batch's policy tokens (ddof 1, eps 1e-8): the
    per-dialogue advantage of a token-whitened estimator whose tokens all carry their dialogue's value."""
    every = np.repeat(values, tokens)
    return (values - every.mean()) / np.sqrt(every.var(ddof=1) + 1e-8)


def _expected_dialogue_advantages(algo):
    """The per-dialogue advantage of each algorithm in plain numpy from the dialogues' rewards (and
    turn lengths): GRPO-family within the groups of four, RLOO leave-one-out, REINFORCE++ whitened
    over the batch's policy tokens, DAPO with the overlong penalties (budget 5, buffer 2) and
    group 2 filtered."""
    r = np.array(_FINALS) / 100
    tokens = 2 * np.array(_TURN)
    if algo == "dapo":
        r = r + 2 * np.array([_overlong(n) for n in _TURN])
    g = r.reshape(3, 4)
    mean, std = g.mean(1, keepdims=True), g.std(1, ddof=1, keepdims=True)
    if algo in ("grpo", "gspo", "cispo", "dapo"):
        adv = np.where(std > 0, (g - mean) / (std + 1e-6), 0.0)
        if algo == "dapo":
            adv[2] = 0.0
        return adv.ravel()
    if algo == "drgrpo":
        return (g - mean).ravel()
    if algo == "rloo":
        return (g - (g.sum(1, keepdims=True) - g) / 3).ravel()
    if algo == "reinforce_pp":
        return _whitened_by_tokens(r, tokens)
    if algo == "reinforce_pp_baseline":
        return _whitened_by_tokens((g - mean).ravel(), tokens)
    raise ValueError(algo)


_ROWS = ["grpo", "rloo", "drgrpo", "dapo", "gspo", "cispo", "reinforce_pp", "reinforce_pp_baseline"]


def _formula_batch(algo):
    rng = np.random.default_rng(5)
    seqs = [dialogue(rng, d // 4, [30.0, 50.0, f], turn=_TURN[d]) for d, f in enumerate(_FINALS)]
    batch = collate(seqs, batch_size=12, length_multiple=8)
    return batch, RLSettings(algo=algo, mini_batch_size=4, micro_batch_size=2, max_new_tokens=5, overlong_buffer=2)


@pytest.mark.parametrize("algo", _ROWS)
def test_estimated_advantages_are_the_estimators_formula(algo):
    """`update.estimate` of each row (what `prepare` does after the models): each dialogue's
    advantage is the formula of `_expected_dialogue_advantages`; DAPO drops group 2's rows from
    the loss (policy mask 0)."""
    batch, rl = _formula_batch(algo)
    arrays = {k: jnp.asarray(v) for k, v in batch.arrays().items()}
    out, metrics = update.estimate(rl, arrays)
    got = np.asarray(update.dialogue_advantages(out["advantages"], arrays["policy_mask"], arrays["dialogue"]))
    np.testing.assert_allclose(got[:12], _expected_dialogue_advantages(algo), rtol=1e-5, atol=1e-6)
    if algo == "dapo":
        assert float(metrics["filtered_groups"]) == 1.0
        np.testing.assert_array_equal(np.asarray(out["policy_mask"]).sum(-1) > 0, np.arange(12) < 8)
    else:
        assert not metrics and "policy_mask" not in out


@pytest.mark.slow
# GRPO's train step hands back its formula in test_grpo_dialogue_advantages_are_the_group_normalised_rewards.
@pytest.mark.parametrize("algo", [a for a in _ROWS if a != "grpo"])
def test_dialogue_advantages_are_the_estimators_formula(algo):
    """One tiny train step of each row of the algorithm table: it runs, and the per-dialogue
    advantages it hands back (the transcripts') are the estimator's formula computed in numpy
    from the batch's rewards; REINFORCE++'s are also an increasing affine map of the rewards.
    DAPO: its overlong penalties enter the rewards, and the group whose rewards are all equal is
    filtered (advantage 0, metric filtered_groups)."""
    batch, rl = _formula_batch(algo)
    cfg = get_preset("tiny")
    opt = make_optimizer(OptimSettings(lr=1e-2, warmup_ratio=0.0, weight_decay=0.0), 10)
    state = train_state.init_train_state(qwen2.init_params(cfg, jax.random.key(0)), opt.tx, seed=0)
    program = rl_program.make_update_program(rl, cfg, None, opt, None)
    state, metrics, advantages = rl_program.train_on_batch(program, state, batch)
    assert int(state.step) == 1 and all(np.isfinite(v) for v in metrics.values()) and metrics["optimizer_steps"] > 0
    np.testing.assert_allclose(advantages[:12], _expected_dialogue_advantages(algo), rtol=1e-5, atol=1e-6)
    assert ("filtered_groups" in metrics) == (algo == "dapo") and metrics.get("filtered_groups", 1.0) == 1.0
    if algo == "reinforce_pp":
        r = np.array(_FINALS) / 100
        slope, intercept = np.polyfit(r, advantages[:12], 1)
        assert slope > 0
        np.testing.assert_allclose(advantages[:12], slope * r + intercept, atol=1e-5)

"""The algorithm table (rlver_jax.rl.algorithms): every row's estimator and loss are registered, its
knobs resolve with the config's fields, meaningless combinations are refused in one line, configs
and the run view read it; a tiny training run of a new row (slow)."""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo_think, ppo_think
from rlver_jax.eval import run_view
from rlver_jax.rl import algorithms, loss_modes, losses, settings, update
from rlver_jax.rl.function_path import FunctionPath
from rlver_jax.train.spec import RunSpec

NEW_ROWS = ("rloo", "reinforce_pp", "reinforce_pp_baseline", "drgrpo", "dapo", "gspo", "cispo")


def test_every_row_is_registered():
    """Each row names a registered estimator and policy loss, an aggregation its loss admits, a
    group size its estimator can compare, and builds its settings."""
    assert set(NEW_ROWS) | {"ppo", "grpo"} <= set(algorithms.ALGORITHMS)
    for name, row in algorithms.ALGORITHMS.items():
        assert row.estimator in algorithms.ESTIMATORS, name
        assert row.policy_loss in loss_modes.POLICY_LOSSES, name
        assert row.loss_agg_mode in loss_modes.POLICY_LOSSES[row.policy_loss].agg_modes, name
        assert row.default_n >= row.min_n, name
        rl = settings.RLSettings(algo=name)
        assert (rl.estimator, rl.policy_loss, rl.loss_agg_mode) == (row.estimator, row.policy_loss, row.loss_agg_mode)
        assert rl.uses_critic == row.critic and rl.min_n == row.min_n


@pytest.mark.parametrize("table", [algorithms.ESTIMATORS, loss_modes.POLICY_LOSSES, loss_modes.CORRECTIONS,
                                   loss_modes.AGG_MODES, loss_modes.KL_ESTIMATORS])
def test_every_table_row_names_a_function_that_exists(table):
    """A row names its function by import path (rlver_jax.rl.function_path): a misspelt one would
    fail only when a train step first calls it."""
    for name, row in table.items():
        path = row if isinstance(row, FunctionPath) else row.function
        assert callable(path.load()), name
    with pytest.raises(ImportError, match="rlver_jax.rl.estimators.vtrace: no such function"):
        FunctionPath("rlver_jax.rl.estimators.vtrace").load()


def test_the_recipes_knobs():
    """The rows' recipes as the issue lists them, and every knob a field of its own."""
    rl = {name: settings.RLSettings(algo=name) for name in algorithms.ALGORITHMS}
    assert not rl["drgrpo"].grpo_normalize_std and rl["drgrpo"].loss_agg_mode == "seq_mean_token_sum_norm"
    d = rl["dapo"]
    assert (d.clip_eps_high, d.loss_agg_mode, d.dynamic_sampling, d.overlong_penalty) == (0.28, "token_mean", True, 1.0)
    assert rl["reinforce_pp"].kl_mode == rl["reinforce_pp_baseline"].kl_mode == "reward"
    assert (rl["gspo"].estimator, rl["gspo"].policy_loss) == ("grpo", "gspo")
    assert (rl["cispo"].estimator, rl["cispo"].policy_loss) == ("grpo", "cispo")
    assert not any(r.dynamic_sampling or r.overlong_penalty for n, r in rl.items() if n != "dapo")
    assert [n for n, r in rl.items() if r.uses_critic] == ["ppo"]
    # A field set on its own wins over the row's; "" / None take the row's.
    mixed = settings.RLSettings(algo="dapo", dynamic_sampling=False, clip_eps_high=0.2, policy_loss="cispo",
                                grpo_normalize_std=False)
    assert (mixed.dynamic_sampling, mixed.clip_eps_high, mixed.policy_loss, mixed.grpo_normalize_std,
            mixed.overlong_penalty) == (False, 0.2, "cispo", False, 1.0)
    assert settings.RLSettings(algo="grpo", estimator="rloo").estimator == "rloo"


@pytest.mark.parametrize("fields, named", [
    (dict(algo="gspo", loss_agg_mode="token_mean"), ("config.rl.policy_loss='gspo'", "config.rl.loss_agg_mode")),
    (dict(algo="grpo", policy_loss="gspo_token", loss_agg_mode="seq_mean_token_sum_norm"),
     ("config.rl.policy_loss='gspo_token'", "config.rl.loss_agg_mode")),
    (dict(algo="ppo", dynamic_sampling=True), ("config.rl.dynamic_sampling", "config.rl.estimator='gae'")),
    (dict(algo="reinforce_pp", turn_credit_weight=0.5), ("config.rl.turn_credit_weight", "config.rl.estimator")),
    (dict(algo="cispo", dual_clip=3.0), ("config.rl.dual_clip", "config.rl.policy_loss='cispo'")),
    (dict(algo="dapo", overlong_buffer=600), ("config.rl.overlong_buffer=600", "config.rollout.max_new_tokens")),
    (dict(algo="grpo", estimator="vtrace"), ("config.rl.estimator='vtrace'",)),
    (dict(algo="grpo", policy_loss="dpo"), ("config.rl.policy_loss='dpo'",)),
])
def test_a_meaningless_combination_is_refused_in_one_line(fields, named):
    with pytest.raises(ValueError) as e:
        settings.RLSettings(**fields)
    assert "\n" not in str(e.value) and all(n in str(e.value) for n in named), str(e.value)


@pytest.mark.parametrize("algo", NEW_ROWS)
def test_every_row_builds_from_a_paper_config(algo):
    """`--config.rl.algo=X` on configs/grpo_think.py:tiny gives X's recipe (the config's "" and
    None fields are the row's), with the rollout's turn budget and the simulator's turns; on a PPO
    config (n = 1) a grouped estimator is refused, naming config.rollout.n."""
    config = grpo_think.get_config("tiny")
    config.rl.algo = algo
    rl = RunSpec.from_config(config).rl
    row = algorithms.ALGORITHMS[algo]
    assert (rl.estimator, rl.policy_loss, rl.loss_agg_mode, rl.clip_eps_high) == (
        row.estimator, row.policy_loss, row.loss_agg_mode, row.clip_eps_high)
    assert (rl.max_new_tokens, rl.max_turns) == (config.rollout.max_new_tokens, config.simulator.max_turns)
    ppo = ppo_think.get_config("tiny")
    ppo.rl.algo = algo
    if row.grouped:
        with pytest.raises(ValueError, match="config.rollout.n >= 2"):
            RunSpec.from_config(ppo)
    else:
        assert RunSpec.from_config(ppo).rl.algo == algo


def test_old_run_configs_keep_their_values():
    """A config.json written before the new fields (explicit loss_agg_mode, clip_eps_high,
    grpo_normalize_std, kl_mode; none of the new ones) builds the same settings as before."""
    config = grpo_think.get_config("tiny").to_dict()
    for new in ("estimator", "policy_loss", "gspo_clip_eps_low", "gspo_clip_eps_high", "cispo_clip_eps_high",
                "overlong_penalty", "overlong_buffer", "dynamic_sampling", "turn_credit_weight"):
        del config["rl"][new]
    config["rl"].update(loss_agg_mode="seq_mean_token_mean", clip_eps_high=0.2, grpo_normalize_std=True,
                        kl_mode="loss")
    import ml_collections
    rl = RunSpec.from_config(ml_collections.ConfigDict(config)).rl
    assert (rl.estimator, rl.policy_loss, rl.loss_agg_mode, rl.dynamic_sampling, rl.overlong_penalty) == (
        "grpo", "ppo", "seq_mean_token_mean", False, 0.0)
    view = run_view.AdvantageSettings.from_run_config(config)
    assert view.per_dialogue and view.normalize_std and view.estimator == "grpo"


def test_the_policy_losses_by_name():
    """gspo: the row's ratio with the row's mean advantage on every token; gspo_token: each token's
    own; cispo: the weight truncated at 1 + cispo_clip_eps_high; ppo: clip-higher from the row."""
    rng = np.random.default_rng(0)
    lp, old, adv = (jnp.asarray(rng.normal(size=(3, 5)).astype(np.float32) * s) for s in (0.3, 0.3, 1.0))
    mask = jnp.asarray((rng.random((3, 5)) < 0.7).astype(np.float32))
    rl = settings.RLSettings(algo="gspo")
    seq_adv = np.asarray((adv * mask).sum(-1) / mask.sum(-1))[:, None] * np.ones((1, 5))
    got, _ = loss_modes.POLICY_LOSSES["gspo"].function(rl, lp, old, adv, mask)
    want, _ = losses.gspo_policy_loss(lp, old, jnp.asarray(seq_adv, jnp.float32), mask, clip_eps_low=3e-4,
                                      clip_eps_high=4e-4)
    np.testing.assert_allclose(np.asarray(got) * mask, np.asarray(want) * mask, rtol=1e-6)
    got, _ = loss_modes.POLICY_LOSSES["gspo_token"].function(rl, lp, old, adv, mask)
    want, _ = losses.gspo_policy_loss(lp, old, adv, mask, clip_eps_low=3e-4, clip_eps_high=4e-4)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    got, _ = loss_modes.POLICY_LOSSES["cispo"].function(settings.RLSettings(algo="cispo", cispo_clip_eps_high=0.1),
                                                        lp, old, adv, mask)
    want, _ = losses.cispo_policy_loss(lp, old, adv, mask, clip_eps_high=0.1)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    got, _ = loss_modes.POLICY_LOSSES["ppo"].function(settings.RLSettings(algo="dapo"), lp, old, adv, mask)
    want, _ = losses.ppo_policy_loss(lp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_seq_mean_token_sum_norm_divides_by_the_turn_budget():
    rl = settings.RLSettings(algo="drgrpo", mini_batch_size=2, micro_batch_size=2, max_new_tokens=10)
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], np.float32)
    batch = {"policy_mask": jnp.asarray(mask), "tokens": jnp.zeros((2, 4), jnp.int32)}
    weights = np.asarray(update.micro_batches(rl, batch, jnp.arange(2))["weights"]).reshape(2, 4)
    np.testing.assert_allclose(weights, mask / 2 / 10)


@pytest.mark.parametrize("algo", ["ppo", *NEW_ROWS])
def test_the_run_view_shows_what_each_row_gives_a_dialogue(algo):
    config = grpo_think.get_config("tiny").to_dict()
    config["rl"]["algo"] = algo
    view = run_view.AdvantageSettings.from_run_config(config)
    assert view.per_dialogue == algorithms.ALGORITHMS[algo].dialogue_advantages == (algo != "ppo")
    text = view.description
    assert text.startswith("Advantage of a dialogue" if view.per_dialogue else "Advantages (gae)")
    assert ("sample std" in text) == (algo in ("gspo", "cispo", "dapo")) and ("dynamic sampling" in text) == (
        algo == "dapo")
    config["rl"].update(estimator="rloo", turn_credit_weight=0.5)
    assert "leave-one-out" in run_view.AdvantageSettings.from_run_config(config).description


def _formula_holds(records, algo):
    """The per-dialogue advantages a step's transcript records against the estimator's formula
    from the transcript's rewards: GRPO-family and RLOO exactly (float32), REINFORCE++ one
    increasing affine map (REINFORCE++-baseline: of the group-centred rewards); DAPO (its overlong
    penalties are not in a transcript): each kept group's advantages sum to 0 and a filtered group's
    are 0."""
    trained = [r for r in records if r["advantage"] is not None]
    groups = {}
    for r in trained:
        groups.setdefault(r["group"], []).append(r)
    rewards = np.array([r["reward"] for r in trained])
    got = np.array([r["advantage"] for r in trained])
    want = []
    for r in trained:
        g = np.array([o["reward"] for o in groups[r["group"]]])
        if algo in ("rloo",):
            want.append(r["reward"] - (g.sum() - r["reward"]) / max(len(g) - 1, 1) if len(g) > 1 else 0.0)
        elif algo == "drgrpo":
            want.append(r["reward"] - g.mean() if len(g) > 1 else 0.0)
        elif algo in ("grpo", "gspo", "cispo"):
            std = g.std(ddof=1) if len(g) > 1 else 0.0
            want.append((r["reward"] - g.mean()) / (std + 1e-6) if std > 0 else 0.0)
    if want:
        np.testing.assert_allclose(got, want, atol=1e-5)
    elif algo in ("reinforce_pp", "reinforce_pp_baseline"):  # whitened rewards, or group-centred ones
        x = rewards if algo == "reinforce_pp" else np.array(
            [r["reward"] - np.mean([o["reward"] for o in groups[r["group"]]]) if len(groups[r["group"]]) > 1 else 0.0
             for r in trained])
        slope, intercept = np.polyfit(x, got, 1)
        assert slope > 0
        np.testing.assert_allclose(got, slope * x + intercept, atol=1e-4)
    elif algo == "dapo":
        for members in groups.values():
            adv = np.array([m["advantage"] for m in members])
            assert abs(adv.sum()) < 1e-4
            if len({m["reward"] for m in members}) == 1:
                assert not adv.any()


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["dapo"])
def test_a_tiny_run_of_a_new_row(algo, tmp_path):
    """launch/train.py --config=configs/grpo_think.py:tiny --config.rl.algo=X for 2 steps of 4
    profiles: it trains, and each step's transcripts record the advantages of the estimator's
    formula (about a minute on 2 shared cores). DAPO: re-sampling and the update's filter."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    workdir = tmp_path / "run"
    out = subprocess.run([sys.executable, "launch/train.py", "--config=configs/grpo_think.py:tiny",
                          f"--config.rl.algo={algo}", f"--config.workdir={workdir}", "--config.train.steps=2",
                          "--config.train.eval_every=0", "--config.rollout.profiles_per_step=4",
                          "--config.rl.dynamic_sampling_retries=1"], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1] and all(np.isfinite(m["policy_loss"]) for m in metrics)
    assert ("filtered_groups" in metrics[0]) == (algo == "dapo")
    for step in (0, 1):
        records = [json.loads(line) for line in (workdir / "transcripts" / f"train_{step:06d}.jsonl").open()]
        _formula_holds(records, algo)

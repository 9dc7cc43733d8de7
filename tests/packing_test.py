"""Packed training rows (rlver_jax/rl/packing.py, logprobs.PackedRows): the host's layouts by hand,
the packed model passes against the rows', and a packed update against the padded one (every
parameter and metric) over think-drop turn rows of uneven lengths, GRPO and PPO."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlver_jax.models import qwen2
from rlver_jax.models.config import get_preset
from rlver_jax.rl import packing, train_state
from rlver_jax.rl import program as rl_program
from rlver_jax.rl.batch import RowTable, StepCollation, collate, policy_positions
from rlver_jax.rl.logprobs import PackedRows, token_logprobs, token_values
from rlver_jax.rl.optimizer import Optimizer
from rlver_jax.rl.settings import RLSettings
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.train import model_loading
from rlver_jax.train.spec import change_kind
from tests.rl_helpers import score

_LENGTHS = [5, 0, 3, 7, 2, 4]


def test_bins_are_first_fit_decreasing_by_hand():
    """Rows of 7, 5, 4, 3, 2 tokens (row 1 is padding) into rows of 10: 7 + 3, 5 + 4, 2; at most one
    row a packed row: each alone; a row longer than the packed rows is an error."""
    assert packing.bins(_LENGTHS, 10, 16) == [[2, 3], [0, 5], [4]]
    assert packing.bins(_LENGTHS, 10, 1) == [[3], [0], [5], [2], [4]]
    with pytest.raises(ValueError, match="a row of 7 tokens does not fit packed rows of 6"):
        packing.bins(_LENGTHS, 6, 16)


def test_layout_numbers_each_slot_by_its_rows_slot():
    source = packing.layout([[2, 3], [0, 5], [4]], _LENGTHS, 10, 4)
    expected = np.full((4, 10), -1)
    expected[0] = [20, 21, 22, 30, 31, 32, 33, 34, 35, 36]
    expected[1, :9] = [0, 1, 2, 3, 4, 50, 51, 52, 53]
    expected[2, :2] = [40, 41]
    np.testing.assert_array_equal(source, expected)
    # The rows' places in a global batch: row r is row 10 + r there.
    np.testing.assert_array_equal(packing.layout([[2, 3]], _LENGTHS, 10, 1, row_ids=np.arange(6) + 10)[0, :4],
                                  [120, 121, 122, 130])


def test_scored_slots_are_the_policy_tokens_but_a_segments_first():
    policy = np.zeros((6, 10), bool)
    policy[3, 0] = policy[3, 2:5] = True  # row 3's first slot can have no log-prob
    policy[2, 1] = True
    source = packing.layout([[2, 3]], _LENGTHS, 10, 1)
    np.testing.assert_array_equal(np.flatnonzero(packing.scored(source, policy)[0]), [1, 5, 6, 7])


def test_packed_counts_are_buckets_of_micro_batches():
    assert packing.packed_count(9, 1, 100) == 10  # 1, 2, ..., 8, 10, 12, ...
    assert packing.packed_count(5, 2, 100) == 6  # 3 micro-batches of 2
    assert packing.packed_count(17, 2, 100) == 20  # 9 micro-batches: 10
    assert packing.packed_count(5, 2, 4) == 4  # never more than unpacked
    assert packing.packed_count(0, 4, 100) == 4
    assert packing.packed_rows(_LENGTHS, 10, 16) == 3 and packing.packed_rows(_LENGTHS, 10, 1) == 5


def test_micro_layouts_hold_each_micro_batchs_rows():
    """Two mini-batches of four rows, micro-batches of two: each micro-batch's packed rows hold its
    two rows' tokens (slots u x T + t of its u-th row) and nothing else; the scored positions are
    their policy tokens'; P is the most any micro-batch needs."""
    rng = np.random.default_rng(0)
    lengths = np.array([6, 3, 9, 2, 5, 0, 7, 4])
    policy = (rng.random((8, 10)) < 0.5) & (np.arange(10) < lengths[:, None])
    order = np.array([[0, 2, 5, 6], [1, 3, 4, 7]])
    source, positions = packing.micro_layouts(lengths, policy, order, micro=2)
    assert source.shape == (2, 2, 2, 10)  # rows 0 and 2 (6 + 9 tokens) need two packed rows
    for s in range(2):
        for m in range(2):
            rows = order[s, 2 * m:2 * m + 2]
            got = np.sort(source[s, m][source[s, m] >= 0])
            want = np.sort(np.concatenate([u * 10 + np.arange(lengths[r]) for u, r in enumerate(rows)]))
            np.testing.assert_array_equal(got, want)
            scored = packing.scored(source[s, m], policy[rows])
            for p in range(source.shape[2]):
                n = scored[p].sum()
                np.testing.assert_array_equal(positions[s, m, p, :n], np.flatnonzero(scored[p]))
                assert not positions[s, m, p, n:].any()


def test_packed_rows_read_their_inputs_and_unpack_back():
    tokens = jnp.arange(60, dtype=jnp.int32).reshape(6, 10) + 1
    source = jnp.asarray(packing.layout([[2, 3], [0, 5], [4]], _LENGTHS, 10, 3))
    packed = PackedRows(source, jnp.zeros((3, 1), jnp.int32))
    t, segments, ids = packed.inputs(tokens)
    np.testing.assert_array_equal(t[2], [41, 42] + [0] * 8)
    np.testing.assert_array_equal(segments[1], [1] * 5 + [6] * 4 + [0])
    np.testing.assert_array_equal(ids[0], [0, 1, 2, 0, 1, 2, 3, 4, 5, 6])
    real = np.arange(10)[None] < np.array(_LENGTHS)[:, None]
    np.testing.assert_array_equal(packed.unpack(t, 6), np.where(real, tokens, 0))


def _uneven_rows():
    """8 right-padded rows of 0 to 30 tokens in 32 slots and their policy tokens (none in the first 4)."""
    rng = np.random.default_rng(4)
    lengths = np.array([11, 30, 7, 19, 24, 5, 0, 16])
    tokens = np.where(np.arange(32) < lengths[:, None], rng.integers(1, 500, (8, 32)), 0).astype(np.int32)
    policy = (np.arange(32) >= 4) & (np.arange(32) < lengths[:, None]) & (rng.random((8, 32)) < 0.6)
    return tokens, policy, lengths


@pytest.mark.slow
def test_packed_log_probs_entropy_and_values_are_the_rows():
    """The tiny model's log-probs and entropy at the policy tokens and a critic's values, run on
    packed rows and unpacked, against the same rows run unpacked."""
    cfg = get_preset("tiny")
    params = qwen2.init_params(cfg, jax.random.key(0))
    tokens, policy, lengths = _uneven_rows()
    table = RowTable(lengths[None], policy[None])
    layout = packing.prepare_layout(table, 0, 1)
    assert layout["pack_source"].shape[0] < len(tokens)  # it packs
    packed = PackedRows(jnp.asarray(layout["pack_source"]), jnp.asarray(layout["pack_positions"]))
    mask = jnp.asarray(np.arange(32) < lengths[:, None])
    rows = token_logprobs(cfg, params, jnp.asarray(tokens), mask, with_entropy=True,
                          positions=jnp.asarray(policy_positions(policy.astype(np.float32))))
    got = packed.logprobs(cfg, params, jnp.asarray(tokens), with_entropy=True)
    for a, b in zip(got, rows):
        np.testing.assert_allclose(np.asarray(a)[policy], np.asarray(b)[policy], atol=2e-5, rtol=0)
        assert not np.asarray(a)[~policy].any()
    critic_cfg, critic = model_loading.critic_from_actor(cfg, params)
    critic["value_kernel"] = jax.random.normal(jax.random.key(1), critic["value_kernel"].shape)
    values = token_values(critic_cfg, critic, jnp.asarray(tokens), mask)
    np.testing.assert_allclose(np.asarray(packed.values(critic_cfg, critic, jnp.asarray(tokens)))[np.asarray(mask)],
                               np.asarray(values)[np.asarray(mask)], atol=2e-5, rtol=0)


def _think_drop_dialogue(rng, group, final, turns):
    """A think_history "drop" dialogue: row k holds the context, the replies of turns before k with
    their users, then turn k's user and reply (its only policy tokens), so rows grow with k."""
    context = list(rng.integers(1, 500, int(rng.integers(3, 9))))
    tokens, mask, ends, starts, history = [], [], [], [], []
    for _ in range(turns):
        user, reply = (list(rng.integers(1, 500, int(rng.integers(lo, hi)))) for lo, hi in ((2, 7), (2, 8)))
        starts.append(len(tokens))
        tokens += context + history + user + reply
        mask += [0] * (len(context) + len(history) + len(user)) + [1] * len(reply)
        ends.append(len(tokens) - 1)
        history += user + reply[:2]
    return score(DialogueSequence(profile_id=f"p{group}", group=group, tokens=tokens, policy_mask=mask,
                                  logprobs=[0.0] * len(tokens), turn_ends=ends, emotions=[30.0, 50.0, final],
                                  end_reason="turn_limit", row_starts=starts), "final")


def _update(algo: str, pack: bool, batch):
    cfg = get_preset("tiny")
    actor = qwen2.init_params(cfg, jax.random.key(0))
    rl = RLSettings(algo=algo, pack_rows=pack, mini_batch_size=8, micro_batch_size=4, ppo_epochs=2)
    # Plain SGD: the parameters move by the gradients themselves (Adam would blow rounding up).
    make = lambda lr: Optimizer(optax.sgd(1.0), optax.constant_schedule(lr))  # noqa: E731
    actor_opt, critic_cfg, critic, critic_opt = make(0.1), None, None, None
    if rl.uses_critic:
        critic_cfg, critic = model_loading.critic_from_actor(cfg, actor)
        critic_opt = make(1e-3)
    state = train_state.init_train_state(actor, actor_opt.tx, critic, critic_opt and critic_opt.tx, seed=0)
    program = rl_program.make_update_program(rl, cfg, critic_cfg, actor_opt, critic_opt)
    return rl_program.train_on_batch(program, state, batch)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_a_packed_update_is_the_padded_one(algo, monkeypatch):
    """8 dialogues of 1 to 4 turn rows (20 rows of 10 to 35 tokens, padded to 24 x 64), mini-batches of
    8 rows (3 an epoch, the last half padding), micro-batches of 4, 2 epochs: packed (prepare's rows in
    8, each micro-batch's in 2) and padded, the same parameters after the update and every metric,
    to float rounding."""
    rng = np.random.default_rng(0)
    seqs = [_think_drop_dialogue(rng, d // 2, float(f), 1 + d % 4)
            for d, f in enumerate([90, 10, 60, 40, 70, 70, 20, 80])]
    batch = collate(seqs, batch_size=8, length_multiple=64, row_multiple=8)
    assert batch.tokens.shape == (24, 64)
    assert packing.prepare_layout(batch.rows(), 0, 4)["pack_source"].shape == (8, 64)
    micro_rows, layouts = [], packing.micro_layouts

    def micro_layouts(*args):
        out = layouts(*args)
        micro_rows.append(out[0].shape[2])
        return out

    monkeypatch.setattr(rl_program.packing, "micro_layouts", micro_layouts)
    padded, packed = _update(algo, False, batch), _update(algo, True, batch)
    assert micro_rows == [2]
    assert padded[1].keys() == packed[1].keys()
    for k, v in padded[1].items():
        assert packed[1][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    np.testing.assert_allclose(packed[2], padded[2], atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=0),
                 (packed[0].actor, packed[0].critic), (padded[0].actor, padded[0].critic))
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), padded[0].actor,
                         qwen2.init_params(get_preset("tiny"), jax.random.key(0)))
    assert max(jax.tree.leaves(moved)) > 1e-3


def test_each_process_packs_its_own_rows_to_the_shapes_all_agree_on():
    """Two processes' step (StepCollation): the batch carries both processes' rows (RowTable); each
    process's packed rows for prepare number its rows in the global batch, and both take the most
    packed rows and scored slots either needs."""
    rng = np.random.default_rng(1)
    seqs = [_think_drop_dialogue(rng, d // 2, 50.0, turns) for d, turns in enumerate([1, 4, 3, 1])]
    owner = np.array([0, 0, 1, 1])
    layouts = []
    for process in (0, 1):
        collation = StepCollation(0, 2, 8, 0, owner, process, 2, pack_rows=True)
        batch, _ = collation.collate(seqs, share=2, step=0)
        table = batch.table
        assert table.lengths.shape == (2, batch.tokens.shape[0])
        np.testing.assert_array_equal(table.lengths[process], batch.attention_mask.sum(-1))
        np.testing.assert_array_equal(table.policy[process], batch.policy_mask > 0)
        rows = batch.tokens.shape[0]
        layouts.append(packing.prepare_layout(table, process, 1, row_ids=np.arange(rows) + process * rows))
    assert layouts[0]["pack_source"].shape == layouts[1]["pack_source"].shape
    assert layouts[0]["pack_positions"].shape == layouts[1]["pack_positions"].shape
    rows = table.lengths.shape[1]
    for process, layout in enumerate(layouts):
        real = layout["pack_source"][layout["pack_source"] >= 0]
        held = set(range(process * rows, (process + 1) * rows))
        assert set(np.unique(real // layout["pack_source"].shape[1])) <= held


def test_packing_is_a_free_field_of_a_resume():
    """It changes the layout, not what is trained (the same numbers to float rounding): a resume may
    turn it on or off."""
    assert change_kind("rl.pack_rows") == "free"


def test_the_micro_batch_bound_holds_whatever_the_shuffle():
    """The planner's bound of the update's packed rows a micro-batch (micro_rows_bound) against the
    layouts of 200 random shuffles of rows of 1 to 64 tokens in rows of 64: never above it; 2 S / T
    + 2 of the longest rows, by hand."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 65, 40)
    policy = np.arange(64) < lengths[:, None]
    bound = packing.micro_rows_bound(lengths, 64, 8)
    assert bound == packing.packed_count(2 * int(np.sort(lengths)[-8:].sum()) // 64 + 2, 1, 8)
    for _ in range(200):
        source, _ = packing.micro_layouts(lengths, policy, rng.permutation(40).reshape(5, 8), 8)
        assert source.shape[2] <= bound

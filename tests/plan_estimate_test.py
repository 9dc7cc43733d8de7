"""The planner's step estimate, piece by piece, against hand-computed cases: the dialogues' lengths
by turn, the update's rows and optimizer steps, the rollout played out against the simulator, the
collectives and kernel grid steps read from hand-written HLO, the terms on a chip. No compiling
(tests/plan_test.py, tpu_compile_test.py and gpu_plan_test.py compile)."""

import dataclasses
import math

import numpy as np
import pytest

from configs import grpo_think, ppo_nothink, ppo_think
from rlver_jax.parallel.chips import CHIPS, Chip
from rlver_jax.train.planner import collectives, hlo_cost, lengths, rollout_time, rows, terms
from rlver_jax.train.planner.estimate import CaseEstimate, UpdateTime
from rlver_jax.train.planner.setup import worst_shapes
from rlver_jax.train.spec import RunSpec


def _spec(module, preset, **fields):
    config = module.get_config(preset)
    config.workdir = "/tmp/unused"
    for path, value in fields.items():
        section, leaf = path.rsplit(".", 1)
        config[section][leaf] = value
    return RunSpec.from_config(config)


def test_a_think_dialogue_keeps_a_share_of_each_output_and_trains_a_row_per_turn():
    """prompt 100, feed 10, a quarter of each 40-token output kept: contexts 100, 100 + 10 + 2 + 10
    = 122, 144; rows (context + output + 2 closing tokens) 142, 164, 186."""
    d = lengths.play(2, 3, 40, 1000, True, lengths.Lengths(prompt=100, feed=10, shown=0.25), at_max=True)
    assert d.contexts.tolist() == [[100, 122, 144]] * 2 and d.outputs.tolist() == [[40, 40, 40]] * 2
    assert d.rows() == [142, 164, 186] * 2 and d.turns.tolist() == [3, 3]
    keep = lengths.play(1, 3, 40, 1000, False, lengths.Lengths(prompt=100, feed=10), at_max=True)
    assert keep.contexts.tolist() == [[100, 152, 204]] and keep.rows() == [246]  # one row: the whole dialogue


def test_a_dialogue_ends_when_its_context_leaves_no_room_for_a_turn():
    """max_total 200: turn 1 at 100 + 40; turn 2 at 152 gets 200 - 152 - 2 = 46 -> 40; turn 3 at
    204 has none."""
    d = lengths.play(1, 3, 40, 200, False, lengths.Lengths(prompt=100, feed=10), at_max=True)
    assert d.outputs.tolist() == [[40, 40, 0]] and d.turns.tolist() == [2]
    short = lengths.play(1, 2, 40, 150, False, lengths.Lengths(prompt=100, feed=10), at_max=True)
    assert short.outputs.tolist() == [[40, 0]]  # 152 leaves nothing for a second turn


def test_lognormal_replies_have_the_configured_mean_and_stay_within_the_budget():
    d = lengths.play(400, 8, 5000, 10 ** 9, False, lengths.Lengths(prompt=10, feed=1, mean_reply=1250), at_max=False)
    out = d.outputs.astype(float)
    clipped_mean = np.mean(np.minimum(np.exp(np.random.default_rng(1).normal(math.log(1250) - 0.5, 1.0, 10 ** 6)),
                                      5000))
    assert out.max() <= 5000 and abs(out.mean() / clipped_mean - 1) < 0.05
    again = lengths.play(400, 8, 5000, 10 ** 9, False, lengths.Lengths(prompt=10, feed=1, mean_reply=1250), False)
    assert (again.outputs == d.outputs).all()  # seeded


@pytest.mark.parametrize("module, dialogues, steps", [(ppo_think, 32, 8), (grpo_think, 128, 8)])
def test_the_7b_think_update_is_8_optimizer_steps_of_turn_rows(module, dialogues, steps):
    """The paper's setting: 32 dialogues (GRPO: 32 x 4) x 8 turn rows, mini-batches of 32 x n rows,
    micro-batches of 4: 8 optimizer steps a model of 8 (GRPO: 32) micro-batches, every row at
    15,360 tokens in the memory plan."""
    spec = _spec(module, "7b")
    shapes = worst_shapes(spec)
    assert (shapes.rows, shapes.length, shapes.real_rows) == (dialogues * 8, 15360, dialogues * 8)
    assert (shapes.optimizer_steps, shapes.loop_steps, shapes.micro_batches) == (steps, steps, dialogues // 4)
    assert (shapes.prepare_rows, shapes.micro_rows) == (dialogues * 8, 4)  # padded rows
    on_4_hosts = worst_shapes(spec, hosts=4)
    assert on_4_hosts.rows == dialogues * 8 and on_4_hosts.optimizer_steps == steps


def test_a_whole_batch_mini_batch_is_one_optimizer_step_whatever_the_rows():
    """mini_batch_size 0 (the CPU presets): one step per epoch over every row; rows are a
    multiple of the dialogue slots (16 dialogues x 3 rows of 100 -> 48 x 128)."""
    spec = _spec(ppo_nothink, "tiny", **{"rl.ppo_epochs": 2})
    shapes = rows.update_shapes(spec, [[100] * 48])
    assert (shapes.rows, shapes.length, shapes.optimizer_steps, shapes.micro_batches) == (48, 128, 2, 6)
    assert shapes.tokens == 4800


def test_rows_mode_skips_a_mini_batch_of_padding_only():
    """Rows mode, 2 hosts: host rows are a multiple of their share of a mini-batch (16); 20 and 3
    real rows -> 32 rows a host, 64 in all, 2 mini-batches of 32 per epoch, both with real rows."""
    spec = _spec(ppo_think, "7b", **{"rollout.profiles_per_step": 8, "rl.mini_batch_size": 32})
    shapes = rows.update_shapes(spec, [[1000] * 20, [1000] * 3], hosts=2)
    assert (shapes.rows, shapes.real_rows, shapes.loop_steps, shapes.optimizer_steps) == (64, 23, 2, 1)


def _sim(latency=1.0, concurrency=64):
    return rollout_time.Simulator(latency, concurrency, "test")


def _flat(seconds):
    return lambda slots, n: terms.Terms(compute=seconds)


def _per_step(seconds):
    return lambda slots, n, steps: terms.Terms(compute=seconds * steps)


def test_the_continuous_engine_plays_each_turn_then_waits_for_the_user():
    """4 dialogues x 3 turns of 10 tokens, calls of up to 4 decode steps (0.025 s a step), prefill
    pieces of 8 (0.05 s a call with one): turn 1's 20-token prompt in 3 calls, the third also
    decoding 4 tokens (0.05, 0.05, 0.15), then 4 and 2 steps (0.1, 0.05); a later turn's 3 new
    tokens in its first call beside 4 steps (0.15, 0.1, 0.05). The user 2 requests of 1 s after a
    turn, 1 after the last: 0.4 + 2 + 0.3 + 2 + 0.3 + 1 = 6.0 s, the device busy 1.0 s of it."""
    d = lengths.play(4, 3, 10, 1000, False, lengths.Lengths(prompt=20, feed=3), at_max=True)
    r = rollout_time.continuous(d, 4, 4, 8, _per_step(0.025), _flat(0.05), _sim())
    assert r.wall == pytest.approx(6.0) and r.device == pytest.approx(1.0) and r.calls == 11
    assert r.decode.seconds == pytest.approx(3 * 0.25) and r.prefill.seconds == pytest.approx(5 * 0.05)
    assert (r.fed, r.sampled) == (4 * (20 + 3 + 3), 4 * 3 * 10)  # a later turn prefills its feed only
    # One request slot for the 4 dialogues: their 20 answers one at a time, the device work between.
    slow = rollout_time.continuous(d, 4, 4, 8, _per_step(0.025), _flat(0.05), _sim(concurrency=1))
    assert 20 + 0.4 <= slow.wall <= 20 + 1.0


def test_fewer_rows_than_dialogues_take_turns_and_refill_a_taken_row():
    """2 rows for 4 dialogues of one 10-token turn: two waves, each one call (the 16-token prompt
    and 10 decode steps); with "drop" a dialogue that keeps its row prefills its context past the
    first prompt only."""
    d = lengths.play(4, 1, 10, 1000, False, lengths.Lengths(prompt=16, feed=3), at_max=True)
    r = rollout_time.continuous(d, 2, 10, 16, _per_step(0.1), _flat(0.5), _sim(latency=0.0))
    assert r.decode.seconds == pytest.approx(2.0) and r.prefill.seconds == pytest.approx(1.0) and r.calls == 2
    drop = lengths.play(1, 2, 10, 1000, True, lengths.Lengths(prompt=16, feed=3, shown=0.5), at_max=True)
    kept = rollout_time.continuous(drop, 1, 10, 16, _per_step(0.1), _flat(0.5), _sim(latency=0.0))
    assert kept.fed == 16 + (5 + 2 + 3)  # turn 2's context 26 less the 16-token prompt the row keeps


def test_terms_beyond_another_program_never_go_below_zero():
    more = terms.Terms(compute=3.0, memory=1.0, kernel_fixed=0.5)
    assert more.beyond(terms.Terms(compute=1.0, memory=2.0)) == terms.Terms(compute=2.0, kernel_fixed=0.5)


def test_the_static_engine_calls_each_group_until_its_longest_reply():
    d = lengths.play(4, 3, 10, 1000, False, lengths.Lengths(prompt=20, feed=3), at_max=True)
    r = rollout_time.static(d, 2, lambda longest: terms.Terms(compute=0.1 * longest), _sim())
    assert r.wall == pytest.approx(9.0) and r.calls == 6  # by hand: the groups' calls one at a time


def test_staleness_hides_the_users_waits_behind_the_update():
    r = rollout_time.RolloutTime(wall=100.0, decode=terms.Terms(compute=30.0), prefill=terms.Terms(compute=10.0),
                                 calls=1, sampled=0, fed=0)
    u = UpdateTime(None, {"prepare": terms.Terms(memory=20.0), "actor update": terms.Terms(compute=30.0)})
    on = CaseEstimate("x", r, u, 5.0, 0, 0.0, 0.0)
    assert on.step == on.on_policy == 155.0 and on.hidden == pytest.approx(100 + 55 - 100)
    assert dataclasses.replace(on, staleness=1).step == 100.0  # max(100, 40 + 50 + 5)


_COLLECTIVES_HLO = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%body (p: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %p = (s32[], f32[1024]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[1024]{0} get-tuple-element(%p), index=1
  %r = f32[1024]{0} all-reduce(%x), channel_id=1, replica_groups=[2,2]<=[4], use_global_device_ids=true, to_apply=%add
  ROOT %t = (s32[], f32[1024]{0}) tuple(%i, %r)
}

%cond (p.1: (s32[], f32[1024])) -> pred[] {
  %p.1 = (s32[], f32[1024]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %n = s32[] constant(10)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

ENTRY %main (a: (s32[], f32[1024]), g: f32[256]) -> ((s32[], f32[1024]), (f32[256], f32[1024])) {
  %a = (s32[], f32[1024]{0}) parameter(0)
  %w = (s32[], f32[1024]{0}) while(%a), condition=%cond, body=%body
  %g = f32[256]{0} parameter(1)
  %ag = (f32[256]{0}, f32[1024]{0}) all-gather-start(%g), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %t = ((s32[], f32[1024]{0}), (f32[256]{0}, f32[1024]{0})) tuple(%w, %ag)
}
"""


class _Compiled:
    def __init__(self, text):
        self.text = text

    def as_text(self):
        return self.text

    def cost_analysis(self):
        return None


def test_collectives_are_counted_by_their_loops_groups_and_links():
    """The loop's all-reduce runs 10 times over pairs (iota [2,2]<=[4]: {0,1}, {2,3}), each sending
    2 x 1/2 x 4 KB; the all-gather-start gathers 4 KB over all 4 devices (3/4 of it), asynchronously.
    Devices 0, 1 on one node and 2, 3 on another: the pairs stay inside, the gather crosses."""
    assert collectives.groups("replica_groups=[2,2]<=[4], x") == [[0, 1], [2, 3]]
    assert collectives.groups("replica_groups=[2,2]<=[2,2]T(1,0)") == [[0, 2], [1, 3]]
    assert collectives.groups("replica_groups={{0,3},{1,2}}, dimensions") == [[0, 3], [1, 2]]
    cost = hlo_cost.program_cost(_Compiled(_COLLECTIVES_HLO), domains=[0, 0, 1, 1])
    assert cost.near_sync == 10 * 2 * 0.5 * 4096 and cost.near_steps == 10 * 2
    assert cost.far_async == 0.75 * 4096 and cost.far_steps == 3 and cost.far_sync == cost.near_async == 0
    assert cost.collectives == 11
    one_node = hlo_cost.program_cost(_Compiled(_COLLECTIVES_HLO), domains=[0, 0, 0, 0])
    assert one_node.near_async == 0.75 * 4096 and one_node.far_async == 0


def test_the_ragged_kernels_grid_steps_are_kv_heads_and_blocks_of_rows():
    """A decode step's ragged call: q [8 rows, 1 kv head, 7 query rows, 128], stacks [28, 8, 1,
    15104, 128]: the 8 rows' 56 query rows fit one grid step (1 a layer, whatever the slots); a
    prefill piece of 256 tokens a row (1,792 query rows): one row a step, 8."""
    k = "u16[28,8,1,15104,128]"
    for q, want in (("bf16[8,1,7,128]", 1), ("bf16[8,1,1792,128]", 8)):
        instr = hlo_cost._Instr("ragged_decode_attention.1", q, "custom-call",
                                "%q, %k, %v), custom_call_target=\"tpu_custom_call\"")
        assert hlo_cost._grid_steps(instr, {"q": q, "k": k, "v": k}) == want


def test_terms_add_what_the_roofline_leaves_out():
    chip = Chip("x", "x", 1.0, 100.0, 16.0, near_gb_s=10.0, far_gb_s=1.0, near_step_us=1.0, far_step_us=10.0,
                grid_step_us=0.5, op_us=2.0)
    cost = hlo_cost.Cost(flops=2e12, bytes=100e9, xla_flops=0, xla_bytes=0, near_sync=10e9, near_async=40e9,
                         far_sync=1e9, near_steps=1e6, far_steps=1e5, grid_steps=2e6, ops=1e6)
    t = terms.terms(cost, chip)
    assert (t.compute, t.memory, t.overlapped, t.collectives) == (2.0, 1.0, 4.0, 2.0)
    assert t.latency == pytest.approx(1.0 + 1.0) and (t.kernel_fixed, t.op_fixed) == (1.0, 2.0)
    assert t.seconds == pytest.approx(4.0 + 2.0 + 2.0 + 1.0 + 2.0)  # the async bytes outlast compute and HBM


def test_every_target_chip_names_its_links():
    for chip in CHIPS.values():
        assert chip.near_gb_s > 0 and chip.far_gb_s > 0 and chip.host_gb_s > 0 and chip.near_step_us > 0
    assert all(c.grid_step_us == 0.35 for c in CHIPS.values() if c.name.startswith("v"))

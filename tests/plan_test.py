"""The memory planner compiles the run's own programs from a training config (8 virtual devices).

Compiling is the cost here: the configs are the presets' with short dialogues (the figures at the
paper's lengths are in docs/sharding.md), and the 0.5B case lowers and compiles the actor's update only.
"""

import functools
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import grpo_think, ppo_think
from rlver_jax.parallel import sharding, topology
from rlver_jax.parallel.chips import Chip
from rlver_jax.rl.batch import TrainBatch
from rlver_jax.train import run
from rlver_jax.train.planner import hlo_cost, plan, report, search
from rlver_jax.train.planner.compiled import Phase
from rlver_jax.train.planner.lengths import Lengths
from rlver_jax.train.planner.phases import run_phases
from rlver_jax.train.planner.sampler import rollout_shapes, sampling_layout
from rlver_jax.train.planner.setup import abstract_setup, crossing_bytes, device_bytes, resident
from rlver_jax.train.spec import RunSpec
from tests.fixtures_eval import profile

REPO = pathlib.Path(__file__).resolve().parents[1]


def _config(module, preset, workdir, **fields):
    """The config of `module:preset` in `workdir` with dotted fields set, e.g. {"rl.micro_batch_size": 4}."""
    config = module.get_config(preset)
    config.workdir = str(workdir)
    for path, value in fields.items():
        *parents, leaf = path.split(".")
        functools.reduce(getattr, parents, config)[leaf] = value
    return config


def _tiny(module, workdir):
    """The tiny preset on 128-token rows. Its profiles open with the simulator's words, not a written
    first line: build_run refuses a written opening that, with the system prompt, fills a row."""
    workdir.mkdir(parents=True, exist_ok=True)
    profiles = workdir / "profiles.jsonl"
    profiles.write_text("".join(json.dumps({k: v for k, v in profile(f"P{i}").items() if k != "first_talk"}) + "\n"
                                for i in range(12)))
    return _config(module, "tiny", workdir, **{"rollout.max_total_tokens": 128, "train.length_multiple": 64,
                                              "rollout.profiles_per_step": 8, "rollout.cache_slots": 256,
                                              "mesh.shape": (1, 4, 2), "data.train_profiles": str(profiles)})


@pytest.mark.slow
@pytest.mark.parametrize("module", [ppo_think, grpo_think])
def test_planner_lowers_the_trainers_programs(module, tmp_path):
    """Each of build_run's jitted train-step programs (prepare, the actor's and the critic's
    updates), lowered on the real state and a placed batch, is the very program the planner
    lowers from shapes: the same HLO."""
    config = _tiny(module, tmp_path)
    r = run.build_run(RunSpec.from_config(config))
    s = abstract_setup(RunSpec.from_config(config))
    host = TrainBatch(**{k: np.zeros(v.shape, v.dtype) for k, v in s.batch.items() if k != "policy_positions"})
    host.policy_mask[:] = 1.0
    placed = sharding.shard_host_batch(r.mesh, host.arrays())
    models = r.state.models()
    assert s.update.prepare.lower(s.models, s.frozen, s.batch).as_text() == \
        r.update.prepare.lower(models, r.update.frozen(r.frozen), placed).as_text()
    inputs, rows, _, _ = r.update.prepare(models, r.update.frozen(r.frozen), placed)
    names = ["actor", "critic"] if module is ppo_think else ["actor"]
    assert [name for name, _ in r.update.model_programs()] == names and s.rl.uses_critic == (len(names) == 2)
    planned = dict(s.update.model_programs())
    for model, fn in r.update.model_programs():
        real = (r.state.step, *r.state.model(model), r.update.frozen(r.frozen).base(), inputs, rows)
        mine = (s.state.step, *s.state.model(model), s.base, s.inputs, s.rows)
        assert planned[model].lower(*mine).as_text() == fn.lower(*real).as_text()


_PPO_UNREAD = ("group", "turn", "turn_rewards", "turn_scored")  # batch arrays PPO's prepare does not read


def _read(tree: dict, unread: tuple[str, ...]) -> dict:
    return {k: v for k, v in tree.items() if k not in unread}


@pytest.mark.slow
def test_plan_reports_every_phase_from_xlas_memory_analysis(tmp_path):
    """Every phase of a PPO run compiled. Prepare's arguments are exactly the models' and the
    batch's shards; each model's program reads its own state, the prepared inputs it uses and the
    mini-batch rows, its state updated in place; resident is the rest of the state on the devices."""
    config = _tiny(ppo_think, tmp_path)
    config.train.eval_policy.cache_slots = 0
    config.rollout.engine = "static"  # the rollout engine's phases: test_the_rollout_engine_is_planned_...
    result = plan.plan(RunSpec.from_config(config), memory_gb=16.0, search=False)
    # The KV cache's own programs follow the rollout's; the evaluation re-encodes (its cache off here).
    assert [p.name for p in result.phases] == ["prepare", "actor update", "critic update", "rollout",
                                               "rollout compact", "rollout grow", "evaluation"]
    s = result.setup
    prepare, actor, critic, rollout = result.phases[:4]
    opt_states = device_bytes((s.state.actor_opt, s.state.critic_opt))
    # PPO (GAE) reads no groups and none of the turn-level arrays.
    assert prepare.arguments == device_bytes((s.models, _read(s.batch, _PPO_UNREAD)))
    assert prepare.resident == opt_states
    # The actor reads no values or returns, the critic no old log-probs, advantages or policy
    # positions (it values every token): hand lists.
    own = {"actor": (actor, ("values", "returns")),
           "critic": (critic, ("old_logprobs", "advantages", "policy_positions"))}
    for model, (phase, unread) in own.items():
        other = "critic" if model == "actor" else "actor"
        assert phase.arguments == device_bytes((s.state.step, s.state.model(model),
                                                _read(s.inputs, unread), s.rows))
        assert phase.resident == device_bytes((s.state.rng, s.batch, s.state.model(other)))
        assert phase.temporaries > 0 and phase.outputs < 0.01 * phase.arguments
    # Each phase's total counts the whole train state once: as arguments, or resident.
    for p in result.phases:
        assert p.resident + p.arguments >= device_bytes(s.state)
    assert result.fits and result.peak.total == max(p.total for p in result.phases)
    text = report.format_plan(result, "configs/ppo_think.py:tiny")
    assert "{'data': 1, 'fsdp': 4, 'tensor': 2}" in text and "fits in 16 GB" in text
    assert "no LM head" in text and "KV cache of 256 slots" in text
    assert "evaluation 4 profiles per sampler call" in text and "4 held-out profiles" in text
    assert "offload    none; with --config.train.offload=state: prepare" in text
    assert "roofline" not in text and "target" not in text  # a CPU plan: no chip to estimate against


@pytest.mark.slow
def test_offload_takes_the_parts_in_host_memory_off_each_phase(tmp_path):
    """train.offload: less resident, the same arguments. "state" (planned): prepare holds nothing
    but its arguments (the AdamW states wait in host memory), each update the run key, the batch and
    its own model only, the rollout only the step and key; a step moves, by hand: both models'
    params in, the critic's out, the actor's AdamW state in, the actor out, the critic in, the critic
    out. "idle": the updates' residents as "state", prepare's and the rollout's as "none"."""
    config = _tiny(ppo_think, tmp_path)
    config.train.offload = "state"
    result = plan.plan(RunSpec.from_config(config), memory_gb=16.0, search=False,
                       phases=("prepare", "actor update", "critic update", "rollout"))
    s = result.setup
    by_name = {p.name: p for p in result.phases}
    key_and_batch = device_bytes((s.state.rng, s.batch))
    actor, actor_opt, critic, critic_opt = (device_bytes(x) for x in (s.state.actor, s.state.actor_opt,
                                                                      s.state.critic, s.state.critic_opt))
    for name in ("actor update", "critic update"):
        assert by_name[name].resident == key_and_batch == resident(s, name, "idle")
        assert "in host memory" in by_name[name].note
    assert by_name["prepare"].arguments == device_bytes((s.models, _read(s.batch, _PPO_UNREAD)))
    assert by_name["prepare"].resident == 0 and resident(s, "prepare", "idle") == actor_opt + critic_opt
    step_and_key = device_bytes((s.state.step, s.state.rng))
    assert by_name["rollout"].resident == step_and_key
    assert resident(s, "rollout", "idle") == step_and_key + actor + actor_opt + critic + critic_opt
    assert crossing_bytes(s) == (actor + critic) + critic + actor_opt + (actor + actor_opt) + (critic + critic_opt) * 2
    assert crossing_bytes(s, "idle") == (critic + critic_opt) * 2 + (actor + actor_opt) * 2
    assert crossing_bytes(s, "none") == 0
    text = report.format_plan(result)
    assert "offload    state: in host memory (prepare: actor_opt, critic_opt;" in text and "update     peak" in text
    assert "between steps: actor, actor_opt, critic, critic_opt)" in text


@pytest.mark.slow
def test_rollout_is_planned_on_one_hosts_sampling_copy(tmp_path):
    """Two hosts of 4 devices: a host samples its 4 of the 8 dialogues on its own copy of the
    actor (SamplingLayout over its devices) beside the whole train state; the program's
    arguments are that copy and the host's token ids, mask and row keys (replicated), by hand."""
    config = _config(ppo_think, "tiny", tmp_path, **{"rollout.max_total_tokens": 128, "rollout.cache_slots": 0,
                                                    "rollout.profiles_per_step": 8, "mesh.shape": (1, 4, 2),
                                                    "rollout.engine": "static"})
    s = abstract_setup(RunSpec.from_config(config), host_devices=4)
    shapes = rollout_shapes(RunSpec.from_config(config), 512, s.hosts)
    assert s.hosts == 2 and (shapes.rows, shapes.prompt) == (4, 128)
    layout = sampling_layout(s, 4)
    assert dict(layout.local.shape) == {"data": 1, "fsdp": 2, "tensor": 2}
    phase = shapes.phases(s, 4)[0]
    assert phase.resident == device_bytes(s.state)
    b, e = shapes.rows, shapes.prompt
    assert phase.arguments == layout.device_bytes(s.update.actor_cfg) + b * e * (4 + 1) + b * 2 * 4 + b * 4


@pytest.mark.slow
def test_the_rollout_engine_is_planned_on_its_kv_rows(tmp_path):
    """The rollout engine (the default): every dialogue of a host in one engine, its KV rows holding
    what a dialogue can hold (max_total_tokens 128 -> 128 slots). The decoding call's arguments are
    the host's copy of the actor, the cache (rows split over the host mesh's batch axes, kv heads
    over tensor), the rows' state (four int32 and a bool a row, keys: two words) and the rows
    served (a bool a row), all replicated, by hand; then the same call with a prefill piece, at most
    a turn's feed, for every row."""
    config = _config(ppo_think, "tiny", tmp_path, **{"rollout.max_total_tokens": 128, "rollout.max_new_tokens": 16,
                                                    "rollout.profiles_per_step": 8, "mesh.shape": (1, 4, 2)})
    spec = RunSpec.from_config(config)
    s = abstract_setup(spec, host_devices=4)
    shapes = rollout_shapes(spec, 40, s.hosts)
    assert (shapes.rows, shapes.cache_slots, shapes.chunk) == (4, 128, 64)
    decode, prefill = run_phases(s, ["rollout"], 40)
    assert (decode.name, prefill.name) == ("rollout", "rollout prefill")
    cfg, layout = s.update.actor_cfg, sampling_layout(s, 4)
    r = shapes.rows
    per_device_cache = 2 * cfg.num_layers * r * 128 * cfg.num_kv_heads * cfg.head_dim * 4 // 4  # f32, over 4 devices
    mask = r * 128 // 2 + 4  # bools, rows over the 2 batch shards; the cache's shared index (unused)
    state = 4 * r * 4 + r * 2 * 4 + r + r  # last, fill, column, limit; key; live; and the rows served
    assert decode.arguments == layout.device_bytes(cfg) + per_device_cache + mask + state
    piece = 4 * r * 4 + r * 64 * 4 + r * 2 * 4  # place, starts, counts, limits; ids; keys
    assert prefill.arguments == layout.device_bytes(cfg) + per_device_cache + mask + state + piece
    assert decode.resident == device_bytes(s.state)
    assert "rollout engine on each of 2 hosts: 4 KV rows of 128 slots" in shapes.describe()


@pytest.mark.slow  # recompiles the programs at each shape the search tries
def test_plan_search_finds_the_largest_micro_batch_then_the_longest_dialogue(tmp_path, monkeypatch):
    """The search against a hand-made cost (bytes = micro-batch x tokens): it recompiles (here:
    re-plans) with each override and returns the largest shape under the budget."""
    config = _config(grpo_think, "tiny", tmp_path, **{"rollout.max_total_tokens": 1024, "mesh.shape": (1, 2, 4),
                                                      "rollout.max_new_tokens": 8, "rollout.cache_slots": 2048,
                                                      "rollout.engine": "static"})

    def fake(s, phases, feed_tokens):
        if phases == ["rollout"]:  # rows per sampler call x cache slots
            shapes = rollout_shapes(s.spec, feed_tokens)
            return [Phase("rollout", 0, 0, shapes.rows * shapes.cache_slots, 0, 0.0)]
        # The update's programs: the actor's at micro-batch x tokens, prepare's at half of that.
        cost = {"actor update": s.rl.micro_batch_size * s.seq_len, "prepare": s.rl.micro_batch_size * s.seq_len // 2}
        return [Phase(name, 0, 0, cost[name], 0, 0.0) for name in phases]

    monkeypatch.setattr(search, "run_phases", fake)
    update = ["prepare", "actor update"]
    # micro-batch 8 of 32 at 1024 tokens: 8192 "bytes"; 4 x 1024 fits 4096, 2 x 1024 = 2048 fits 2100.
    assert search.fitting_shapes(RunSpec.from_config(config), 4096, update, 512, print) == [
        "--config.rl.micro_batch_size=4"]
    assert search.fitting_shapes(RunSpec.from_config(config), 2100, update, 512, print) == [
        "--config.rl.micro_batch_size=2"]
    assert search.fitting_shapes(RunSpec.from_config(config), 2100, ["prepare"], 512, print) == [
        "--config.rl.micro_batch_size=4"]
    # Below the smallest micro-batch (2, one per batch shard): the longest 64-multiple dialogue.
    assert search.fitting_shapes(RunSpec.from_config(config), 1000, update, 512, print) == [
        "--config.rl.micro_batch_size=2", "--config.rollout.max_total_tokens=448"]
    assert search.fitting_shapes(RunSpec.from_config(config), 100, update, 512, print)[-1].startswith("nothing")
    # The rollout: 32 dialogues x 2048 slots; more pipeline groups first, then fewer cache slots,
    # at least a turn of 8 new tokens plus the smallest feed (16): 32 x 32 fits 1100, not 1000.
    assert search.fitting_shapes(RunSpec.from_config(config), 16384, ["rollout"], 512, print) == [
        "--config.rollout.pipeline_groups=4"]
    assert search.fitting_shapes(RunSpec.from_config(config), 1100, ["rollout"], 512, print) == [
        "--config.rollout.cache_slots=32"]
    assert search.fitting_shapes(RunSpec.from_config(config), 1000, ["rollout"], 512, print)[-1].startswith(
        "nothing: rollout.cache_slots=32")
    # The rollout engine: 32 KV rows of what a dialogue of max_total_tokens 1024 holds, 1024 slots;
    # fewer rows first, then shorter dialogues: one row of max_total_tokens 512 (512 slots) fits 600,
    # 528 (640 slots) does not.
    config.rollout.engine = "continuous"
    engine = RunSpec.from_config(config)
    assert search.fitting_shapes(engine, 8 * 1152, ["rollout"], 512, print) == ["--config.rollout.engine_rows=8"]
    assert search.fitting_shapes(engine, 600, ["rollout"], 512, print) == [
        "--config.rollout.engine_rows=1", "--config.rollout.max_total_tokens=512"]


def test_largest_bisects_a_monotone_predicate():
    calls = []

    def fits(n):
        calls.append(n)
        return n <= 37

    assert search._largest(list(range(1, 101)), fits) == 37 and len(calls) <= 7
    assert search._largest([5, 6], lambda n: False) is None


class _Unreadable:
    """A compiled program whose `as_text` has the C++ print a line on stderr, then fails or not."""

    def __init__(self, fails: bool):
        self.fails = fails

    def as_text(self) -> str:
        os.write(2, b"E0000 status_macros.cc:58] INTERNAL: RET_CHECK failure\n*** Begin stack trace ***\n")
        if self.fails:
            raise RuntimeError("INTERNAL: RET_CHECK failure (hlo_instruction.cc:390)")
        return "HloModule m"


def test_hlo_text_holds_back_the_cxx_log_of_a_module_it_cannot_read(capfd):
    """jaxlib's log of a libtpu module it cannot read back (a C++ stack trace on stderr) is dropped:
    the planner reports the error in its table ("no roofline"); after a success it is printed."""
    with pytest.raises(RuntimeError, match="RET_CHECK"):
        hlo_cost.hlo_text(_Unreadable(fails=True))
    assert capfd.readouterr().err == ""
    assert hlo_cost.hlo_text(_Unreadable(fails=False)) == "HloModule m"
    assert "RET_CHECK failure" in capfd.readouterr().err


def test_accelerator_types_count_cores_or_chips_as_cloud_does():
    assert topology.accelerator_type("v5p", (2, 2, 2)) == "v5p-16"
    assert topology.accelerator_type("v4", (2, 2, 4)) == "v4-32"
    assert topology.accelerator_type("v5e", (4, 4)) == "v5litepod-16"
    assert topology.accelerator_type("v6e", (2, 2)) == "v6e-4"


@pytest.mark.slow
def test_planner_at_half_a_billion_parameters(tmp_path):
    """The 0.5B preset (24 scanned layers, the real shapes) at 1024-token dialogues, the actor's
    update alone: the per-device state is the exact shard arithmetic and XLA agrees."""
    config = _config(ppo_think, "0.5b", tmp_path, **{"rollout.max_total_tokens": 1024, "rl.micro_batch_size": 8})
    s = abstract_setup(RunSpec.from_config(config))
    assert s.mesh.shape["fsdp"] == 8 and s.state.critic is not None
    # fsdp splits every model width D by 8; biases and norms stay whole (hand count, fp32).
    v, d, layers, n, k, h, f = 151936, 896, 24, 14, 2, 64, 4864
    layer = d // 8 * (n + 2 * k) * h + (n + 2 * k) * h + n * h * d // 8 + 3 * d * f // 8 + 2 * d
    assert device_bytes(s.state.actor) == 4 * (v * d // 8 + layers * layer + d) == 247_266_816
    (phase,) = run_phases(s, ["actor update"], 512)
    args = (s.state.step, s.state.actor, s.state.actor_opt, _read(s.inputs, ("values", "returns")), s.rows)
    assert phase.arguments == device_bytes(args)
    assert 0 < phase.temporaries < 16e9


@pytest.mark.slow
def test_launch_plan_on_one_cpu_device_and_a_bad_mesh(tmp_path):
    """launch/plan.py with the tiny preset on one CPU device prints a plan that fits, and of a GRPO
    run compiles no critic update (nor says so); a mesh that the device count cannot make is one
    line naming config.mesh.shape, no traceback, exit 2."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "PYTHONPATH": str(REPO)}
    base = [sys.executable, str(REPO / "launch" / "plan.py"), "--config=configs/grpo_think.py:tiny",
            "--phases=actor update,critic update", "--config.rollout.max_total_tokens=128",
            f"--config.workdir={tmp_path}"]
    ok = subprocess.run(base, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "= 1 cpu devices" in ok.stdout and "fits in 16 GB" in ok.stdout
    assert "compiling actor update" in ok.stderr and "critic" not in ok.stderr, ok.stderr
    bad = subprocess.run(base + ["--config.mesh.shape=(1,1,2)"], capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=600)
    assert bad.returncode == 2 and "config.mesh.shape" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_lora_plan_is_the_trainers_programs_on_adapters_and_one_base(tmp_path):
    """With config.lora.rank the planner lowers build_run's LoRA programs (the same HLO), its state
    is the adapters (by hand: rank x (fan in + fan out) per adapted kernel, fp32) and the deltas of
    tiny's modules_to_save (the embedding and the norms) with their AdamW moments, and the frozen
    base is counted once, as an argument of every program."""
    config = _tiny(ppo_think, tmp_path)
    config.lora.rank, config.lora.targets = 4, "q,o,down"
    r = run.build_run(RunSpec.from_config(config))
    s = abstract_setup(RunSpec.from_config(config))
    host = TrainBatch(**{k: np.zeros(v.shape, v.dtype) for k, v in s.batch.items() if k != "policy_positions"})
    host.policy_mask[:] = 1.0  # every token scored, as the planner's batch
    placed = sharding.shard_host_batch(r.mesh, host.arrays())
    assert s.update.prepare.lower(s.models, s.frozen, s.batch).as_text() == \
        r.update.prepare.lower(r.state.models(), r.update.frozen(r.frozen), placed).as_text()
    inputs, rows, _, _ = r.update.prepare(r.state.models(), r.update.frozen(r.frozen), placed)
    planned = dict(s.update.model_programs())
    for model, fn in r.update.model_programs():
        real = (r.state.step, *r.state.model(model), r.update.frozen(r.frozen).base(), inputs, rows)
        mine = (s.state.step, *s.state.model(model), s.base, s.inputs, s.rows)
        assert planned[model].lower(*mine).as_text() == fn.lower(*real).as_text()

    cfg = r.update.actor_cfg
    d, q, f = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.intermediate_size
    adapter_bytes = cfg.num_layers * 4 * (d + q + q + d + f + d) * 4  # q: D->NH, o: NH->D, down: F->D; fp32
    adapter_bytes += (cfg.vocab_size * d + 2 * cfg.num_layers * d + d) * 4  # embedding and norm deltas (tied head)

    def total(tree):
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))

    assert total(s.state.actor) == adapter_bytes and total(s.state.actor_opt) >= 2 * adapter_bytes
    assert total(s.state.critic) == adapter_bytes + 4 * (d + 1)  # + the value head, [D, 1] and [1]
    result = plan.plan(RunSpec.from_config(config), memory_gb=16.0, phases=("actor update",), search=False)
    assert result.sizes["frozen base"] == device_bytes(s.ref) and "reference params" not in result.sizes
    (actor,) = result.phases
    assert actor.arguments == device_bytes((s.state.step, s.state.model("actor"), s.ref,
                                            _read(s.inputs, ("values", "returns")), s.rows))
    assert actor.resident == device_bytes((s.state.rng, s.batch, s.state.model("critic")))
    text = report.format_plan(result, "lora")
    assert "LoRA rank 4 (alpha 16) on q,o,down of one frozen base in float32, also the reference" in text


@pytest.mark.slow  # compiles the update at two shapes
def test_a_think_update_grows_with_its_turn_rows(tmp_path):
    """With think_history "drop" every turn is a training row: three turns are three times the
    rows, each longer than the first turn's (its context holds the earlier replies), so the planned
    update, compiled at each step's own shapes on a CPU of fixed figures, grows at least 2.5x."""
    chip = Chip("cpu", "cpu", 0.05, 5.0, 16.0)
    updates = []
    for turns in (1, 3):
        config = _config(ppo_think, "tiny", tmp_path / str(turns), **{"simulator.max_turns": turns})
        result = plan.plan(RunSpec.from_config(config), 16.0, ("prepare", "actor update", "critic update"),
                           Lengths(prompt=100, feed=20), search=False, host_chip=chip)
        bound = result.estimate.bound.update
        assert bound.shapes.real_rows == 16 * turns and bound.shapes.optimizer_steps == 1
        updates.append(bound)
    assert updates[1].seconds >= 2.5 * updates[0].seconds
    assert updates[1].shapes.length > updates[0].shapes.length

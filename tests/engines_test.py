"""The engine table (rlver_jax.engines.table): engines by name, the old name refused, a field the
chosen engine does not read refused with the engines that do; a toy third row (a served-like
engine answering from a script, planning no device program) registered by the test alone, which
the config check, the rollout settings, the banner, the planner and a tiny rollout read with no
edit elsewhere; and the copy of the published weights the JAX engines keep when asked."""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo_think
from configs.simulator import get_simulator_config
from rlver_jax.engines.published import Published
from rlver_jax.engines.seam import PolicyTurn
from rlver_jax.engines.table import ENGINES, EngineRow, EngineSettings, check_read
from rlver_jax.models.config import get_preset
from rlver_jax.rollout.episodes import EpisodeRequest, EpisodeRunner
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.simulator import SimulatorSettings, build_simulator
from rlver_jax.simulator.profiles import load_profiles
from rlver_jax.text import chat
from rlver_jax.train import banner
from rlver_jax.train.spec import FREE, RunSpec

REPLY = "<think>Listen first.</think>That sounds hard. What happened next?"  # the think mode of grpo_think


class ScriptedEngine:
    """A served-like engine: every turn is the script's reply, tokenised as a server would return it
    (log-probs -1); `publish` only records the versions it was sent (a server's weight sync)."""

    def __init__(self, model_cfg, chat_tokens, sampling, settings, rng):
        del model_cfg, sampling, settings, rng
        self.chat, self.published, self.sent = chat_tokens, Published(), []

    def publish(self, version, params, *, private=False):
        self.sent.append(version)
        self.published.put(version, None)  # the weights went to the server: nothing kept here

    def reseed(self, rng):
        del rng

    async def act(self, requests):
        ids = chat._text_ids(self.chat.tokenizer, REPLY) + [self.chat.im_end]
        version, _ = self.published.resolve(requests[0].version)
        return [PolicyTurn(REPLY, ids, [-1.0] * len(ids), version=version) for _ in requests]

    def release(self, session):
        del session


# A served engine's row: its class, no field of its own, each turn straight in, the planner's plan of an
# engine that samples off the trainer's devices, its words.
TOY = EngineRow(build=f"{__name__}.ScriptedEngine", reads=frozenset(), continuous=True,
                plan="rlver_jax.train.planner.sampler.off_device_plan",
                summary="scripted replies from a server, weights pushed in publish")


def _config(engine="toy"):
    config = grpo_think.get_config("tiny")
    config.rollout.engine = engine
    return config


def test_the_engines_are_named_for_what_they_are_and_the_old_name_is_refused():
    assert list(ENGINES) == ["continuous", "static"] and ENGINES.words() == "continuous | static"
    assert EngineSettings().engine == "continuous" and ENGINES["continuous"].continuous
    assert not ENGINES["static"].continuous
    with pytest.raises(ValueError, match=r"^config\.rollout\.engine='jax' is now called 'continuous': "
                                         r"use --config\.rollout\.engine=continuous$"):
        RunSpec.from_config(_config("jax"))
    with pytest.raises(ValueError, match=r"config\.policy\.engine='vllm': use one of continuous \| static"):
        EngineSettings(engine="vllm", where="config.policy.")


def test_a_field_counts_where_the_chosen_engine_reads_it():
    """The continuous engine reads its rows and chunks, the static one how calls are formed and its
    cache; a field given to the other is refused in one line naming the engine that reads it."""
    check_read("continuous", {"engine", "engine_rows", "decode_chunk", "prefill_chunk", "temperature"},
               "config.rollout.")
    check_read("static", {"engine", "pipeline_groups", "batch_wait_s", "cache_slots", "max_new_tokens"},
               "config.rollout.")
    with pytest.raises(ValueError, match=r"^--config\.rollout\.batch_wait_s --config\.rollout\.cache_slots set, but "
                                         r"--config\.rollout\.engine=continuous does not read them: add "
                                         r"--config\.rollout\.engine=static to use them"):
        check_read("continuous", {"cache_slots", "batch_wait_s", "temperature"}, "config.rollout.")
    # The in-loop evaluation samples on the rollout's engine: its cache slots are the static engine's.
    with pytest.raises(ValueError, match=r"--config\.train\.eval_policy\.cache_slots set, but "
                                         r"--config\.rollout\.engine=continuous does not read it"):
        RunSpec.from_config(_config("continuous"), given=["train.eval_policy.cache_slots"])
    spec = RunSpec.from_config(_config("static"), given=["rollout.engine", "rollout.cache_slots",
                                                           "train.eval_policy.cache_slots"])
    assert not spec.rollout.continuous and not spec.eval.rollout.continuous


def test_every_field_an_engine_reads_is_free_and_configs_name_every_engine():
    """A resume may change the engine and its fields (how sampling is laid out, not what is
    trained); --print_config names the engines of both fields that choose one."""
    for name, row in ENGINES.items():
        assert {f"rollout.{f}" for f in row.reads | {"engine"}} <= set(FREE)
    from configs import eval as eval_config
    from rlver_jax.cli.config_doc import describe

    for config, file, field in ((_config("continuous"), "configs/grpo_think.py", "rollout.engine"),
                                (eval_config.get_config("tiny"), "configs/eval.py", "policy.engine")):
        line = next(line for line in describe(config, file).splitlines() if line.startswith(f"{field} = "))
        assert line.endswith("(one of: continuous | static)"), line


def test_a_toy_engine_row_is_read_everywhere_with_no_edit_elsewhere(chat_tokens):
    with ENGINES.added("toy", TOY):
        # The config check: accepted by name, fields only the others read refused, naming them.
        spec = RunSpec.from_config(_config(), given=["rollout.engine"])
        assert spec.engine.row is TOY and spec.rollout.continuous and spec.eval.rollout.continuous
        with pytest.raises(ValueError, match=r"--config\.rollout\.engine_rows set, but --config\.rollout\.engine=toy "
                                             r"does not read it: add --config\.rollout\.engine=continuous to use it"):
            RunSpec.from_config(_config(), given=["rollout.engine_rows"])
        with pytest.raises(ValueError, match=r"add --config\.rollout\.engine=static to use it"):
            RunSpec.from_config(_config(), given=["rollout.pipeline_groups"])
        # The banner: its row's words.
        lines = banner.describe(spec, params=1, train_profiles=[], eval_profiles=[], mesh_shape={"data": 1},
                                platform="cpu")
        assert lines[-1] == "engine     toy: scripted replies from a server, weights pushed in publish"
        # The planner: the plan its row names.
        from rlver_jax.train.planner.sampler import rollout_shapes

        shapes = rollout_shapes(spec, 512, hosts=2)
        assert shapes.describe() == ("toy engine (scripted replies from a server, weights pushed in publish); "
                                     "nothing sampled on the trainer's devices")
        assert shapes.hosts == 2 and shapes.programs == () and shapes.phases(None, None) == []
        assert rollout_shapes(spec, 512, evaluation=True).evaluation
        # A tiny rollout: the engine built by its row, publish as the trainer does, each turn straight in.
        engine = spec.engine.build(get_preset("tiny"), chat_tokens, spec.sampling, jax.random.key(0))
        engine.publish(0, {"w": jnp.zeros(2)}, private=True)
        sim = get_simulator_config()
        sim.update(backend="embedded", max_turns=2)
        runner = EpisodeRunner(engine, build_simulator(SimulatorSettings.from_config(sim)), chat_tokens,
                               spec.rollout)
        profiles = load_profiles()[:2]
        seqs = asyncio.run(runner.run([EpisodeRequest(p, g) for g, p in enumerate(profiles)]))
        assert engine.sent == [0] and [len(s.turn_ends) for s in seqs] == [2, 2]
        assert all(t["raw"] == REPLY and t["policy_version"] == 0 for s in seqs for t in s.turns)
    assert "toy" not in ENGINES


@pytest.mark.slow  # builds the abstract run (~6 s)
def test_the_plan_of_a_toy_engine_compiles_nothing_and_says_so():
    from rlver_jax.train.planner import plan, report

    with ENGINES.added("toy", TOY):
        result = plan.plan(RunSpec.from_config(_config()), phases=["rollout"], search=False)
        assert result.phases == []
        assert "rollout    toy engine (scripted replies from a server" in report.format_plan(result, "toy")


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("private", [False, True])
def test_a_jax_engine_keeps_a_copy_of_its_own_when_asked(chat_tokens, engine, private):
    """The update donates the published arrays: with `private` (max_staleness > 0) the engine samples
    on its own copy, which survives the donation with the published values; without, on them."""
    sampler = EngineSettings(engine=engine).build(get_preset("tiny"), chat_tokens, SamplingSettings(),
                                                  jax.random.key(0))
    params = {"w": jnp.arange(4.0), "step": "v0"}  # non-array leaves pass through
    sampler.publish(0, params, private=private)
    doubled = jax.jit(lambda p: p * 2, donate_argnums=(0,))(params["w"])
    _, got = sampler.published.resolve(0)
    assert got["step"] == "v0"
    if private:
        assert got["w"] is not params["w"] and not got["w"].is_deleted()
        np.testing.assert_array_equal(got["w"], [0.0, 1.0, 2.0, 3.0])
    else:
        assert got["w"] is params["w"] and got["w"].is_deleted()
    np.testing.assert_array_equal(doubled, [0.0, 2.0, 4.0, 6.0])


@pytest.fixture(scope="module")
def chat_tokens(tiny_tokenizer_dir):
    return chat.ChatTokens.from_tokenizer(chat.load_tokenizer(tiny_tokenizer_dir))

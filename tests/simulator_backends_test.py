"""The simulator backend table (rlver_jax.simulator.backends): a third backend is one row (here an
LLM user over a transport answering in this process), and the settings, the factory, the banner and
the protocol card read its row, never calling it embedded or served."""

import asyncio

import pytest

from configs import grpo_think
from configs.simulator import get_simulator_config
from rlver_jax import simulator
from rlver_jax.eval import protocol
from rlver_jax.simulator import backends
from rlver_jax.simulator.settings import check_read
from rlver_jax.train import banner
from rlver_jax.train.spec import RunSpec

EN = next(p for p in simulator.load_profiles() if p.language == "en")


class InProcess:
    """A transport answering in this process (as a JAX simulator on the trainer's mesh would): every
    emotion step +7, every reply step the same words."""

    model = "in-process-1b"

    def __init__(self):
        self.requests = []

    async def complete(self, messages, response_format, *, temperature, max_tokens):
        self.requests.append((messages, response_format, temperature, max_tokens))
        if "Change:" in messages[0]["content"]:
            return "Intent: x\nFit: y\nInner reaction: z\nFeeling: w\nChange: +7"
        return "Plan: go on\nResponse: Go on, I am listening."

    async def aclose(self):
        pass


@pytest.fixture
def in_process():
    """The transport of a backend "in_process" registered in the table: an LLM user, not served."""
    transport = InProcess()
    with backends.BACKENDS.added("in_process", backends.BackendRow(
            build=backends.llm_user(lambda client: transport), reads=backends.LLM_USER_FIELDS | {"model"},
            served=False, summary="in process (a test's transport)")):
        yield transport


def test_a_third_backend_is_built_from_its_row_and_plays_through_its_transport(in_process):
    cfg = get_simulator_config()  # RLVER's training rules: from 30, changes clipped to +-10
    cfg.backend, cfg.temperature = "in_process", 0.25
    settings = simulator.SimulatorSettings.from_config(cfg, given={"model", "temperature"})
    simulator.check_endpoint(settings)  # not served: nothing to ask (no server listens anywhere)

    async def one_turn():
        async with simulator.build_simulator(settings) as sim:
            return await sim.respond(await sim.start(EN), "That sounds hard. What happened?")

    state = asyncio.run(one_turn())
    assert state.emotions == (30, 37) and state.history[-1]["content"] == "Go on, I am listening."
    assert [(t, n) for _, _, t, n in in_process.requests] == [(0.25, 2048), (0.25, 2048)]  # emotion, then reply


def test_a_field_is_refused_where_the_backend_does_not_read_it_and_the_readers_are_named(in_process):
    check_read("in_process", {"model", "temperature", "difficulty", "max_turns"})
    with pytest.raises(ValueError, match=r"--config\.simulator\.base_url set, but --config\.simulator\.backend="
                                         r"'in_process' does not read it: add --config\.simulator\.backend=openai "):
        check_read("in_process", {"base_url", "model"})
    with pytest.raises(ValueError, match=r"--config\.simulator\.model set, .* add --config\.simulator\.backend=openai "
                                         r"or --config\.simulator\.backend=in_process to use it"):
        check_read("embedded", {"model"})


def test_the_banner_and_the_protocol_card_describe_a_backend_by_its_row(in_process):
    config = grpo_think.get_config("tiny")
    config.simulator.backend, config.simulator.model = "in_process", "q7"
    spec = RunSpec.from_config(config)
    sim = spec.simulator
    line = banner.describe(spec, params=1, train_profiles=[], eval_profiles=[],
                           mesh_shape={"data": 1}, platform="cpu")[1]
    assert line == ("simulator  in process (a test's transport), model 'q7', vanilla user, at most 1 policy turn(s); "
                    "a served LLM needs --config.simulator.backend=openai")
    assert protocol.served_simulator_models(sim) is None  # not served: no server asked
    card = protocol.simulator_fields(sim, None)
    assert (card["simulator.backend"], card["simulator.model"]) == ("in_process", "q7")
    assert (card["simulator.temperature"], card["simulator.max_tokens"], card["simulator.structured_output"]) == \
        (0.5, 2048, "off")  # configs/simulator.py's
    assert card["run.simulator_url"] is None and card["simulator.served_models"] is None
    embedded = protocol.simulator_fields(RunSpec.from_config(grpo_think.get_config("tiny")).simulator, None)
    assert (embedded["simulator.model"], embedded["simulator.temperature"], embedded["run.simulator_url"]) == \
        ("embedded judge fitted on SAGE's results", None, None)


def test_the_transport_fields_are_read_by_the_served_backend_alone():
    """TRANSPORT (how answers are fetched) is a part of what the served row reads; the embedded row
    reads none of it; the training spec lets a resume change every one (train/spec.FREE)."""
    from rlver_jax.train.spec import change_kind

    assert backends.TRANSPORT < backends.BACKENDS["openai"].reads and not backends.BACKENDS["embedded"].reads
    assert {change_kind(f"simulator.{f}") for f in backends.TRANSPORT} == {"free"}
    assert change_kind("simulator.temperature") == "may change"

"""Range checks of the settings types: each bound at its edge, one message naming every bad field."""

import pytest

from configs.eval import get_config as eval_config
from configs.grpo_think import get_config as training_config
from rlver_jax.checks import build_all, check_ranges
from rlver_jax.eval.spec import BenchmarkSettings, CapabilitiesSpec, EvalSpec
from rlver_jax.llm_client import ClientSettings
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.train.spec import LoopSettings


def test_each_bound_holds_at_its_edge_and_fails_past_it():
    check_ranges({"a.n": 1, "a.t": 1e-9, "a.p": 1.0}, lowest={"n": 1}, positive=("t",), fraction=("p",))
    with pytest.raises(ValueError) as e:
        check_ranges({"a.p": 0.0, "a.t": 0.0, "a.n": 0}, lowest={"n": 1}, positive=("t",), fraction=("p",))
    # lowest bounds first, then the positive, then the fractions: the order check_config had
    assert str(e.value) == "a.n=0 must be >= 1; a.t=0.0 must be > 0; a.p=0.0 must be in (0, 1] (1 is off)"
    with pytest.raises(ValueError, match=r"^a.p=1.5 must be in \(0, 1\]"):
        check_ranges({"a.p": 1.5}, fraction=("p",))


def test_build_all_names_every_failing_settings_in_order():
    def bad(message):
        raise ValueError(message)

    assert build_all(lambda: 1, lambda: "x") == [1, "x"]
    with pytest.raises(ValueError, match=r"^first; second$"):
        build_all(lambda: bad("first"), lambda: 2, lambda: bad("second"))


def test_settings_name_their_config_section():
    with pytest.raises(ValueError, match=r"^config.train.eval_policy.top_k=-1 must be >= 0$"):
        SamplingSettings(top_k=-1, where="config.train.eval_policy.")
    assert SamplingSettings(where="config.rollout.") == SamplingSettings()  # `where` names, it does not compare
    config = training_config("tiny")
    config.checkpoint.keep = 0
    config.rollout.max_staleness = -1
    with pytest.raises(ValueError, match=r"^config.rollout.max_staleness=-1 must be >= 0; "
                                         r"config.checkpoint.keep=0 must be >= 1$"):
        LoopSettings.from_config(config)
    with pytest.raises(ValueError, match=r"^--timeout_s=0 must be > 0$"):  # a flag of launch/analyze.py
        ClientSettings(name="judge", flag_prefix="--", base_url="", model="", api_key_env="", timeout_s=0,
                       max_concurrency=1, max_retries=0)


def test_the_evaluation_checks_every_section_before_it_starts():
    config = eval_config("tiny")
    config.eval.group_size = 0
    config.simulator.max_concurrency = 0
    config.policy.top_p = 0.0
    for read in (BenchmarkSettings.from_config, EvalSpec.from_config):
        with pytest.raises(ValueError) as e:
            read(config)
        assert str(e.value) == ("config.eval.group_size=0 must be >= 1; config.policy.top_p=0.0 must be in (0, 1] "
                                "(1 is off); config.simulator.max_concurrency=0 must be >= 1")


def test_the_capability_run_checks_every_section_before_it_starts():
    from configs.capabilities import get_config as capabilities_config

    config = capabilities_config("tiny")
    config.policy.top_p = 0.0
    config.code.memory_mb = 0
    with pytest.raises(ValueError) as e:
        CapabilitiesSpec.from_config(config)
    assert str(e.value) == ("config.policy.top_p=0.0 must be in (0, 1] (1 is off); "
                            "config.code.memory_mb=0 must be at least 1")

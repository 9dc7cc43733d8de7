"""A training run's first lines say what it runs: the policy, the simulator (and its server when
served), the profiles by language, the mesh, the algorithm and the rollout engine."""

import json

from configs import grpo_think
from rlver_jax.simulator.profiles import DEFAULT_PROFILES, load_profiles
from rlver_jax.train import banner
from rlver_jax.train.spec import RunSpec


def test_the_tiny_run_names_its_embedded_simulator_and_its_profiles():
    config = grpo_think.get_config("tiny")
    profiles = load_profiles(DEFAULT_PROFILES)
    # The shipped file's languages by the ids' own tag ("rlverjax-en-03"), not by the detector.
    ids = [json.loads(line)["id"] for line in DEFAULT_PROFILES.read_text().splitlines() if line.strip()]
    train_ids = ids[:-4]  # tiny holds out the last 4
    en = sum("-en-" in i for i in train_ids)
    lines = banner.describe(RunSpec.from_config(config), params=123_456, train_profiles=profiles[:-4],
                            eval_profiles=profiles[-4:], mesh_shape={"data": 1, "fsdp": 2, "tensor": 1},
                            platform="cpu")
    policy, simulator, profile_line, mesh, algorithm, engine = lines
    assert "random weights of preset 'tiny', 0.1M parameters, float32 weights" in policy
    assert simulator.startswith("simulator  embedded") and "--config.simulator.backend=openai" in simulator
    assert f"{len(train_ids)} (en {en}, zh {len(train_ids) - en})" in profile_line
    assert "held out: the last 4 of them: 4 (en 4)" in profile_line and "evaluated every 10 steps" in profile_line
    assert mesh.startswith("mesh       {'data': 1, 'fsdp': 2, 'tensor': 1} = 2 cpu device(s)")
    assert algorithm.startswith("algorithm  grpo, 8 profiles x 4 dialogue(s) a step, think-then-say, 40 steps")
    assert engine.startswith("engine     continuous: continuous batching on the trainer's weights")


def test_a_served_simulator_is_named_with_its_url_and_model():
    config = grpo_think.get_config("tiny")
    config.simulator.backend, config.simulator.base_url, config.simulator.model = "openai", "http://sim:30000/v1", "q72"
    spec = RunSpec.from_config(config)
    line = banner.describe(spec, params=1, train_profiles=[], eval_profiles=[], mesh_shape={"data": 1},
                           platform="gpu")[1]
    assert line.startswith("simulator  served (openai backend) at http://sim:30000/v1, model 'q72'")

"""Train an empathetic dialogue policy with RLVER (PPO or GRPO).

  python launch/train.py --config=configs/grpo_think.py:tiny --config.workdir=/tmp/rlver_tiny
  python launch/train.py --config=configs/ppo_think.py --config.model.path=/models/Qwen2.5-7B-Instruct \
      --config.data.train_profiles=/data/rlver/train_profile.jsonl \
      --config.simulator.base_url=http://simhost:30000/v1

Ablations are config overrides (--config.rl.algo=grpo --config.rollout.n=4,
--config.simulator.difficulty=challenging, --config.rollout.max_staleness=1). A typo in an
override is an error: the config is locked. --print_config shows every field with its comment.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # configs/ and rlver_jax/

from absl import app  # noqa: E402

from rlver_jax import cli  # noqa: E402

_CONFIG = cli.config_flag("config", None, "Training config file[:preset], e.g. configs/grpo_think.py:tiny.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; settings go in --config.* flags")
    import jax

    from rlver_jax import sharding, training

    config = _CONFIG.value
    cli.enable_compilation_cache(config.compilation_cache_dir)
    # Launch-time guards, before anything touches a device: random draws split over the mesh
    # give the same numbers on any mesh, and every process joins the multi-host run.
    jax.config.update("jax_threefry_partitionable", True)
    sharding.maybe_initialize_distributed(sharding.DistributedSettings.from_config(config.mesh.distributed))
    training.train(config)


if __name__ == "__main__":
    cli.run(main, required=["config"])

"""Train an empathetic dialogue policy with RLVER (PPO or GRPO).

  python launch/train.py --config=configs/grpo_think.py:tiny --config.workdir=/tmp/rlver_tiny
  python launch/train.py --config=configs/ppo_think.py --config.model.path=/models/Qwen2.5-7B-Instruct \
      --config.data.train_profiles=/data/rlver/train_profile.jsonl \
      --config.simulator.base_url=http://simhost:30000/v1

Ablations are config overrides (--config.rl.algo=grpo --config.rollout.n=4,
--config.simulator.difficulty=challenging, --config.rollout.max_staleness=1). A typo in an
override is an error: the config is locked.
"""

import logging
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # configs/ and rlver_jax/

import jax  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from rlver_jax import sharding, training  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file[:preset].", lock_config=True)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; settings go in --config.* flags")
    logging.getLogger("rlver_jax").setLevel(logging.INFO)
    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every checkpoint file at INFO
    # Launch-time guards, before anything touches a device: random draws split over the mesh
    # give the same numbers on any mesh, and every process joins the multi-host run.
    jax.config.update("jax_threefry_partitionable", True)
    sharding.maybe_initialize_distributed(sharding.DistributedSettings.from_config(_CONFIG.value.mesh.distributed))
    training.train(_CONFIG.value)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)

"""Train an empathetic dialogue policy with RLVER (PPO or GRPO).

  python launch/train.py --config=configs/grpo_think.py:tiny --config.workdir=/tmp/rlver_tiny
  python launch/train.py --config=configs/ppo_think.py --config.model.path=/models/Qwen2.5-7B-Instruct \
      --config.data.train_profiles=/data/rlver/train_profile.jsonl \
      --config.simulator.base_url=http://simhost:30000/v1

Ablations are config overrides (--config.rl.algo=grpo --config.rollout.n=4,
--config.simulator.difficulty=challenging, --config.rollout.max_staleness=1). A typo in an
override is an error: the config is locked.

Exit status: 0 done (the last line says where the outputs are); 1 an error of the config, the
data, the simulator or the disk (one line saying what to fix; rerunning resumes); 130 Ctrl-C (the
running step is finished and saved first; the line says where the checkpoint is).
"""

import logging
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # configs/ and rlver_jax/

import jax  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from rlver_jax import checkpoint, sharding, training  # noqa: E402
from rlver_jax.llm_client import EndpointUnavailableError  # noqa: E402
from rlver_jax.rollout.buffer import RolloutError  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file[:preset].", lock_config=True)

# Errors of the config, the data, the simulator or the disk: one line, no traceback.
_USER_ERRORS = (ValueError, OSError, EndpointUnavailableError, training.AllDialoguesFailedError)
_DISK_FULL_OR_READ_ONLY = ("No space left on device", "Disk quota exceeded", "Read-only file system")


def _message(error: BaseException, workdir: pathlib.Path) -> str:
    text = str(error)
    if any(s in text for s in _DISK_FULL_OR_READ_ONLY) or isinstance(error, PermissionError):
        steps = checkpoint.saved_steps(workdir / "checkpoints")
        kept = f"the checkpoint of step {steps[-1]}" if steps else "no checkpoint yet"
        text += (f". Kept: {kept} in {workdir / 'checkpoints'} and the finished steps' metrics and transcripts; "
                 f"free space on (or make writable) the disk of {workdir}, then rerun the same command to resume")
    return text


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; settings go in --config.* flags")
    logging.getLogger("rlver_jax").setLevel(logging.INFO)
    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every checkpoint file at INFO
    config = _CONFIG.value
    workdir = pathlib.Path(config.workdir)
    # Launch-time guards, before anything touches a device: random draws split over the mesh
    # give the same numbers on any mesh, and every process joins the multi-host run.
    jax.config.update("jax_threefry_partitionable", True)
    try:
        sharding.maybe_initialize_distributed(sharding.DistributedSettings.from_config(config.mesh.distributed))
        training.train(config)
    except KeyboardInterrupt as e:  # TrainingInterrupted says what was saved
        print(f"train.py: {e}" if str(e) else
              f"train.py: interrupted; rerun the same command to resume from the newest checkpoint in "
              f"{workdir / 'checkpoints'} (if any)", file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        cause = e.__cause__ if isinstance(e, RolloutError) else e  # raised in the rollout producer
        if not isinstance(cause, _USER_ERRORS):
            raise
        sys.exit(f"train.py: error: {_message(cause, workdir)}")
    if jax.process_index() == 0:
        steps = checkpoint.saved_steps(workdir / "checkpoints")
        print(f"outputs in {workdir}: metrics.jsonl, tensorboard/, transcripts/, reward.png; checkpoint "
              f"{f'step {steps[-1]}' if steps else 'none'} in {workdir / 'checkpoints'}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)

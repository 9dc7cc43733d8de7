r"""Train an empathetic dialogue policy with RLVER (PPO or GRPO).

  .venv/bin/python launch/train.py --config=configs/grpo_think.py:tiny --config.workdir=runs/tiny
  .venv/bin/python launch/train.py --config=configs/ppo_think.py --config.model.path=/models/Qwen2.5-7B-Instruct \
      --config.data.train_profiles=/data/rlver/train_profile.jsonl \
      --config.simulator.base_url=http://simhost:30000/v1

Ablations are config overrides (--config.rl.algo=grpo --config.rollout.n=4,
--config.simulator.difficulty=challenging, --config.rollout.max_staleness=1). A typo in an
override is an error: the config is locked. --print_config shows every field with its comment.

On Ctrl-C (exit 130) or SIGTERM (143, a preemption) the running step is finished and saved
first, within config.checkpoint.stop_within_s; the line says where the checkpoint is; rerunning
the same command resumes. A simulator down past config.simulator.outage_budget_s saves the same way
and exits 75. A bad field stops it before JAX is imported and anything is written. One process of
several runs the run as its child and watches it (rlver_jax/cli/watchdog.py): losing process 0
ends it with one line and exit 75.
"""

import os
import pathlib
import signal
import sys
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # configs/ and rlver_jax/

from rlver_jax.cli import program  # noqa: E402  (first: one line outside the venv)
from rlver_jax.cli import watchdog  # noqa: E402

from absl import app  # noqa: E402

_CONFIG = program.config_flag("config", None, "Training config file[:preset], e.g. configs/grpo_think.py:tiny.")

_DISK_FULL_OR_READ_ONLY = ("No space left on device", "Disk quota exceeded", "Read-only file system")


def _disk_message(error: OSError, workdir: pathlib.Path) -> str:
    """The error, and for a full or read-only disk what was kept and how to resume."""
    from rlver_jax.train import checkpoint

    text = str(error)
    if any(s in text for s in _DISK_FULL_OR_READ_ONLY) or isinstance(error, PermissionError):
        steps = checkpoint.saved_steps(workdir / "checkpoints")
        kept = f"the checkpoint of step {steps[-1]}" if steps else "no checkpoint yet"
        text += (f". Kept: {kept} in {workdir / 'checkpoints'} and the finished steps' metrics and transcripts; "
                 f"free space on (or make writable) the disk of {workdir}, then rerun the same command to resume")
    return text


def _on_sigterm(workdir: pathlib.Path):
    """The SIGTERM handler outside the training loop (loading, compiling, closing; the loop has its
    own, interrupts.StepGuard): stop as Ctrl-C would, with status 143, once (a SIGTERM can come
    twice: to every process of the job, and passed on by the launcher's watch)."""
    raised = []

    def terminated(signum, frame):
        from rlver_jax.train.interrupts import TrainingInterrupted

        if raised:
            return
        raised.append(signum)
        raise TrainingInterrupted(f"stopped by SIGTERM; rerun the same command to resume from the newest checkpoint "
                                  f"in {workdir / 'checkpoints'} (if any)", 143)

    return terminated


def _spec(config):
    """The run's spec, every field and path checked, and the mesh where the devices are known
    without JAX (no JAX imported)."""
    from rlver_jax.parallel.distributed import DistributedSettings
    from rlver_jax.train.spec import RunSpec

    spec = RunSpec.from_config(config, given=program.given_fields(), preset=program.preset_config())
    spec.check_paths()
    program.check_mesh(spec.mesh.shape, DistributedSettings.from_config(config.mesh.distributed))
    return spec


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; settings go in --config.* flags")
    config = _CONFIG.value
    spec = program.checked_config(lambda: _spec(config))
    from rlver_jax.parallel.distributed import DistributedSettings
    from rlver_jax.train.finished import finished_run

    finished = program.checked_config(lambda: finished_run(spec))
    if finished:  # train.steps reached: said before JAX is imported
        print(finished)
        return
    distributed = program.checked_config(lambda: DistributedSettings.from_config(config.mesh.distributed))
    if (arguments := distributed.initialize_arguments()) is not None:  # one process of several: watch it
        status = watchdog.run_watched(arguments["coordinator_address"], f"config.workdir={config.workdir}",
                                      keep_runtime_log=program.verbose())
        if status is not None:
            return status
    import jax

    from rlver_jax.train import checkpoint, loop
    from rlver_jax.parallel import sharding
    from rlver_jax.rollout.buffer import RolloutError
    from rlver_jax.train.pod import PodWatch

    workdir = pathlib.Path(config.workdir)
    signal.signal(signal.SIGTERM, _on_sigterm(workdir))
    if not program.verbose():
        checkpoint.quiet_orbax_errors()
    program.enable_compilation_cache(config.compilation_cache_dir)
    # Launch-time guards, before anything touches a device: random draws split over the mesh
    # give the same numbers on any mesh, and every process joins the multi-host run.
    jax.config.update("jax_threefry_partitionable", True)
    pod = None
    try:
        joined = sharding.maybe_initialize_distributed(distributed)
        # The mesh against the devices JAX found (before JAX where they were known: _spec): exit 2.
        program.checked_config(lambda: sharding.resolve_mesh_shape(spec.mesh.shape, jax.device_count()))
        if joined and jax.process_count() > 1:
            pod = PodWatch(workdir, distributed.peer_timeout_s).start()  # a lost process: one line, exit 75
        loop.train(spec, on_step=pod.on_step if pod else None)
        if pod is not None:
            pod.stop()
    except KeyboardInterrupt as e:  # TrainingInterrupted says what was saved
        if pod is not None:
            pod.stop()
        print(f"train.py: {e}" if str(e) else
              f"train.py: interrupted; rerun the same command to resume from the newest checkpoint in "
              f"{workdir / 'checkpoints'} (if any)", file=sys.stderr)
        sys.exit(getattr(e, "exit_status", 130))
    except checkpoint.CheckpointWriteError as e:
        if pod is not None:
            pod.explain(e)  # a save that failed because a peer was lost: said as the lost peer
        # Everything of ours is closed; orbax may keep a thread waiting minutes for a signal of the
        # failed save (a read-only disk: 300 s) before the interpreter may exit: leave at once.
        if program.verbose():
            traceback.print_exc()
        print(f"train.py: error: {e}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    except Exception as e:  # noqa: BLE001 - the producer's cause and disk faults as one line; cli sorts the rest
        if pod is not None and program.exit_status(e) != program.EXIT_RESTART:
            pod.explain(e)  # a collective that failed because a peer was lost
        cause = e.__cause__ if isinstance(e, RolloutError) and e.__cause__ is not None else e
        if isinstance(cause, OSError):
            raise program.UserError(_disk_message(cause, workdir)) from e
        if cause is not e and program.is_expected(cause):
            raise program.UserError(str(cause), program.exit_status(cause)) from e
        raise
    if jax.process_index() == 0:
        steps = checkpoint.saved_steps(workdir / "checkpoints")
        print(f"outputs in {workdir}: metrics.jsonl, tensorboard/, transcripts/, reward.png; checkpoint "
              f"{f'step {steps[-1]}' if steps else 'none'} in {workdir / 'checkpoints'}")


if __name__ == "__main__":
    program.run(main, required=["config"],
                statuses=(*program.COMMON_STATUSES, program.EXIT_RESTART, program.EXIT_TERMINATED))

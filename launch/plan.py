r"""Per-device memory and a step estimate of a training run's programs, compiled ahead of time from the config.

  .venv/bin/python launch/plan.py --config=configs/ppo_think.py:tiny
  .venv/bin/python launch/plan.py --config=configs/ppo_think.py:7b --topology=v5e:4x4
  .venv/bin/python launch/plan.py --config=configs/ppo_think.py:7b --topology=v5e:4x4 --slices=2 \
    --config.mesh.shape='(2,-1,4)'
  XLA_FLAGS=--xla_force_host_platform_device_count=16 JAX_PLATFORMS=cpu \
    .venv/bin/python launch/plan.py --config=configs/ppo_think.py:7b --config.mesh.shape='(1,16,1)' --memory_gb=16

Takes the config and overrides of launch/train.py and compiles, from abstract shapes (no weights
are allocated or read), the programs of the train step the run executes (prepare, the actor's and
the critic's updates at the step's training rows: a row per turn with think_history "drop"), the
sampler's programs and the in-loop evaluation's (rlver_jax/train/planner/). Prints per-device
arguments, temporaries and totals per phase, the peak against --memory_gb, and, where a phase does
not fit, the largest micro-batch or dialogue length that does. Then an estimate of the step, term
by term: the update's optimizer steps, its collectives and kernel grid steps, the rollout played
out turn by turn against the simulated user (config.simulator.latency_s), the offload; every reply
at max_new_tokens and replies drawn from a lognormal, under the printed length assumptions
(--prompt_tokens, --feed_tokens, --shown_fraction, --expected_reply_tokens, --reply_log_sd).

--topology=NAME (with libtpu installed: pip install -e '.[tpu]') compiles for that TPU slice
with the TPU compiler, on this host, without a TPU and without XLA_FLAGS: device kind and chip
count, the attention kernel the TPU gets (splash), the TPU compiler's memory per device against
the chip's HBM, the offload's transfers, and the step on the chip's published figures
(rlver_jax/parallel/topology.py, chips.py). --gpu=CARD[:GPUS] or CARD:GPUSxNODES (h100:1, h100:8,
h200:8, a100:8, h100:8x2) does the same for GPUs with the CUDA compiler of jax's CUDA plugin, run
from a venv of its own (pip install -e '.[gpu-plan]': never the project's venv, where every
process would probe for CUDA; e.g. `../gpu-venv/bin/python launch/plan.py
--config=configs/ppo_think.py:7b --gpu=h100:8`): attention as the GPU gets it (cudnn), the card's
memory as the budget, what the run must set for it, the card's published figures
(rlver_jax/parallel/gpu_topology.py). Without either the plan is for this host's devices (on a
CPU, fake the target's device count with XLA_FLAGS=--xla_force_host_platform_device_count=N) and
the step is estimated on this host's CPU, measured (rlver_jax/parallel/host_peaks.py).
--json=FILE writes the figures as data. docs/sharding.md has the figures.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # configs/ and rlver_jax/

from rlver_jax.cli import program  # noqa: E402  (first: one line outside the venv)

from absl import app, flags  # noqa: E402

_CONFIG = program.config_flag("config", None, "Training config file[:preset], as for launch/train.py.")
_MEMORY = flags.DEFINE_float("memory_gb", None, "Per-device memory budget in GB (1e9 bytes); default: the "
                             "--topology chip's HBM (v5e 16, v4 and v6e 32, v5p 95) or the --gpu card's memory "
                             "(h100 and a100 80, h200 141), else 16.")
_TOPOLOGY = flags.DEFINE_string("topology", None, "Compile for this TPU slice with the TPU compiler (compile-only "
                                "devices, needs libtpu): e.g. v5e:4x4, v5e:8x8, v6e:4x4, v5p:2x2x2, v4:2x2x4.")
_GPU = flags.DEFINE_string("gpu", None, "Compile for these GPUs with the CUDA compiler (compile-only devices, needs "
                           "jax's CUDA plugin in a venv of its own: pip install -e '.[gpu-plan]'): CARD[:GPUS] or "
                           "CARD:GPUSxNODES, e.g. h100:1, h100:8, h200:8, a100:8, h100:8x2.")
_SLICES = flags.DEFINE_integer("slices", 1, "With --topology: this many slices, the mesh's data axis over the "
                               "data-centre network between them (mesh.shape[0] a multiple of it).")
_PHASES = flags.DEFINE_list("phases", "prepare,actor update,critic update,rollout,evaluation",
                            "Phases to compile (comma-separated).")
_SEARCH = flags.DEFINE_bool("search", True, "Where a phase does not fit, recompile at smaller shapes to find "
                            "the largest that does.")
_HOIST = flags.DEFINE_bool("hoist_converts", True, "On CPU: False compiles without XLA's loop-invariant code "
                            "motion, which holds fp32 copies of bf16 saved activations that TPUs and GPUs do not "
                            "make (a nearer estimate for them); True: exactly XLA:CPU's figures.")
_HOST = flags.DEFINE_integer("host_devices", None, "Devices per host of the target, for the rollout's host-local "
                             "sampling layout (v5e/v4/v5p hosts: 4, GPU nodes: 8); default: the --topology's hosts or "
                             "the --gpu's nodes, else one host of every device.")
_FEED = flags.DEFINE_integer("feed_tokens", 512, "Tokens a later turn adds to the context besides the kept reply (the "
                             "user's answer and the template): the step estimate's, and the continuous engine's or "
                             "a KV cache's prefill chunk, bucketed.")
_PROMPT = flags.DEFINE_integer("prompt_tokens", 512, "The step estimate's first prompt: the policy's system prompt, "
                               "the profile's opening and the template.")
_SHOWN = flags.DEFINE_float("shown_fraction", 0.25, "think_history 'drop': the share of a turn's output (the reply "
                            "after </think>) later turns' contexts keep, in the step estimate.")
_REPLY = flags.DEFINE_integer("expected_reply_tokens", 0, "The step estimate's second case: replies drawn from a "
                              "lognormal of this mean (0: a quarter of rollout.max_new_tokens); the first has every "
                              "reply at max_new_tokens.")
_LOG_SD = flags.DEFINE_float("reply_log_sd", 1.0, "The log-sd of that lognormal (benchmarks/rollout.py's).")
_MEASURE = flags.DEFINE_bool("measure_host", True, "Without --topology or --gpu: estimate the step on this host's CPU, "
                             "its peak FLOP/s, bandwidth and fixed costs measured by a short microbenchmark "
                             "(rlver_jax/parallel/host_peaks.py, cached).")
_JSON = flags.DEFINE_string("json", "", "Also write the plan's figures as JSON here "
                            "(rlver_jax/train/planner/record.py).")
_FRESH = flags.DEFINE_bool("fresh_host_peaks", False, "Measure this host again instead of reading the cache (the "
                           "figures move with the host's load).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; settings go in --config.* flags")
    from rlver_jax.train.spec import RunSpec

    config = _CONFIG.value
    # A config the run would reject fails here, before JAX is imported, with the run's own one-line error.
    spec = program.checked_config(lambda: RunSpec.from_config(config, given=program.given_fields()))
    import jax

    from rlver_jax.train.planner import plan, report
    from rlver_jax.train.planner.lengths import Lengths
    from rlver_jax.checks import InputError
    from rlver_jax.parallel import gpu_topology, sharding, topology
    from rlver_jax.parallel.distributed import DistributedSettings

    jax.config.update("jax_threefry_partitionable", True)  # as launch/train.py: the same programs
    target = None
    if _TOPOLOGY.value and _GPU.value:
        raise InputError("--topology and --gpu name two targets (a TPU slice, GPUs); give one")
    if _SLICES.value != 1 and not _TOPOLOGY.value:
        raise ValueError("--slices needs --topology (the slices' TPU topology, e.g. --topology=v5e:4x4)")
    # Before anything else (a bad name is one line) and before JAX's backends start (the CUDA
    # plugin registers without a GPU driver under JAX_PLATFORMS=cpu: rlver_jax.parallel.gpu_topology).
    if _TOPOLOGY.value:
        target = topology.tpu_target(_TOPOLOGY.value, _SLICES.value)
    elif _GPU.value:
        target = gpu_topology.gpu_target(_GPU.value)
    else:
        sharding.maybe_initialize_distributed(DistributedSettings.from_config(config.mesh.distributed))
    host_chip = None
    if target is None and _MEASURE.value:
        from rlver_jax.parallel import host_peaks
        from rlver_jax.train.planner import hlo_cost

        host_chip = host_peaks.measure(config.model.dtype, lambda c: hlo_cost.program_cost(c).ops, _FRESH.value)
    lengths = program.checked_config(lambda: Lengths(_PROMPT.value, _FEED.value, _SHOWN.value, _REPLY.value,
                                                     _LOG_SD.value))
    result = plan.plan(spec, _MEMORY.value, _PHASES.value, lengths, _SEARCH.value,
                       log=lambda msg: print(msg, file=sys.stderr, flush=True), hoist_converts=_HOIST.value,
                       host_devices=_HOST.value, target=target, host_chip=host_chip)
    label = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--config=")), "")
    print(report.format_plan(result, label), flush=True)
    if _JSON.value:
        import json

        from rlver_jax.train.planner.record import plan_record

        pathlib.Path(_JSON.value).write_text(json.dumps(plan_record(result, label), indent=1))


if __name__ == "__main__":
    program.run(main, required=["config"])

"""The Sentient benchmark (SAGE protocol) of a policy, and paired comparisons of evaluations.

  # tiny, on a CPU in minutes: a run of launch/train.py (or, without a checkpoint, a fresh model)
  python launch/eval.py --config=configs/eval.py:tiny --config.workdir=/tmp/eval_tiny \\
      --config.policy.checkpoint=/tmp/rlver_tiny
  # a checkpoint of ours, or a served model: see configs/eval.py
  python launch/eval.py --config=configs/eval.py --config.workdir=DIR --config.eval.profiles=FILE \\
      --config.policy.backend=openai --config.policy.base_url=URL --config.policy.model=NAME \\
      --config.simulator.backend=openai --config.simulator.base_url=URL --config.simulator.model=NAME
  # runs side by side, paired per profile (the first is the baseline)
  python launch/eval.py --compare=runs/eval_base,runs/eval_ppo --out=runs/compare_base_ppo

Writes WORKDIR/sentient.json, transcripts.jsonl, report.md, trajectories.png and
final_emotions.png. Rerunning the same command resumes: finished profiles are skipped.
"""

import logging
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # configs/ and rlver_jax/

import jax  # noqa: E402
from absl import app, flags  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from rlver_jax.eval import benchmark, compare  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Evaluation config file[:preset].", lock_config=True)
_COMPARE = flags.DEFINE_list("compare", None, "Evaluation directories to compare, baseline first (no --config).")
_OUT = flags.DEFINE_string("out", None, "With --compare: directory for compare.md, compare.json, compare.png.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; settings go in --config.* flags")
    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax reports every file it reads
    jax.config.update("jax_threefry_partitionable", True)  # the same random draws on any mesh
    logging.getLogger("rlver_jax").setLevel(logging.INFO)
    try:
        if _COMPARE.value:
            if _CONFIG.value is not None or not _OUT.value:
                raise app.UsageError("--compare=DIR_A,DIR_B takes --out=DIR and no --config")
            result = compare.compare_runs(_COMPARE.value, _OUT.value)
            print(f"paired over {result['paired_profiles']} profiles: {pathlib.Path(_OUT.value) / 'compare.md'}")
            return
        if _CONFIG.value is None:
            raise app.UsageError("give --config=configs/eval.py[:tiny] (an evaluation) or --compare=DIR_A,DIR_B")
        summary = benchmark.run_benchmark(_CONFIG.value)
    except benchmark.USER_ERRORS as e:
        sys.exit(f"eval.py: error: {e}")
    workdir = pathlib.Path(_CONFIG.value.workdir)
    print(f"score {summary['score']:.1f}  success {summary['success']}  failure {summary['failure']}  "
          f"n {summary['n']}  simulator errors {summary['simulator_errors']}  ->  {workdir / 'report.md'}")


if __name__ == "__main__":
    app.run(main)

"""Capability retention of a policy: MATH500, IFEval and LiveCodeBench, graded by the field's
own libraries (the `capabilities` extra: pip install -e '.[capabilities]').

  # the data, once, on a machine with a model hub (huggingface_hub); nothing reads a hub at run time
  .venv/bin/python launch/capabilities.py --fetch_data=data/caps
  # a served model (SGLang, vLLM, any OpenAI-compatible endpoint); see configs/capabilities.py
  .venv/bin/python launch/capabilities.py --config=configs/capabilities.py --config.workdir=runs/caps_base \\
      --config.policy.backend=openai --config.policy.base_url=URL --config.policy.model=NAME \\
      --config.data.math500=data/caps/math500/test.jsonl \\
      --config.data.ifeval=data/caps/ifeval/ifeval_input_data.jsonl \\
      --config.data.livecodebench=data/caps/livecodebench
  # a checkpoint of ours, side by side with its base
  .venv/bin/python launch/capabilities.py --config=configs/capabilities.py --config.workdir=runs/caps_ppo \\
      --config.policy.checkpoint=runs/ppo_think_7b --config.data.math500=... --config.compare_to=runs/caps_base
  # tiny, on a CPU: the pipeline end to end
  .venv/bin/python launch/capabilities.py --config=configs/capabilities.py:tiny --config.workdir=runs/caps_tiny \\
      --config.data.math500=FILE

Writes WORKDIR/capabilities.json, items.jsonl, report.md, capabilities.html (and with
--config.compare_to, compare_capabilities.{json,md}). Rerunning the same command resumes:
answered items are not asked again, graded ones not graded again.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # configs/ and rlver_jax/

from rlver_jax.cli import program  # noqa: E402  (first: one line outside the venv)

from absl import app, flags  # noqa: E402

_CONFIG = program.config_flag("config", None, "Capabilities config file[:preset], e.g. configs/capabilities.py.")
_FETCH = flags.DEFINE_string("fetch_data", None, "Download MATH-500, IFEval and LiveCodeBench into this directory "
                             "(needs huggingface_hub and a hub; no --config).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; settings go in --config.* flags")
    if _FETCH.value:
        if _CONFIG.value is not None:
            raise app.UsageError("--fetch_data=DIR takes no --config")
        from rlver_jax.eval.capabilities import fetch

        print(f"checksums: {fetch.fetch(pathlib.Path(_FETCH.value))}")
        return
    if _CONFIG.value is None:
        raise app.UsageError("give --config=configs/capabilities.py[:tiny] (an evaluation) or --fetch_data=DIR")
    from rlver_jax.eval.policy_source import POLICY_BACKENDS
    from rlver_jax.eval.spec import CapabilitiesSpec

    spec = CapabilitiesSpec.from_config(_CONFIG.value)
    if POLICY_BACKENDS.row(spec.policy.backend).needs_jax:  # a served policy starts without JAX
        import jax

        program.enable_compilation_cache(spec.compilation_cache_dir)
        jax.config.update("jax_threefry_partitionable", True)  # the same random draws on any mesh
    from rlver_jax.eval.capabilities import report, runner

    scores = runner.run(spec)
    workdir = pathlib.Path(spec.workdir)
    for bench, s in scores.items():
        head = report.HEADLINE[bench]
        print(f"{report.NAMES[bench]}: {head} {100 * s[head]:.1f}% (n {s['n']})")
    print(f"-> {workdir / report.REPORT}" + (f"; comparison {workdir / 'compare_capabilities.md'}"
                                             if spec.compare_to else ""))


if __name__ == "__main__":
    program.run(main, statuses=(*program.COMMON_STATUSES, program.EXIT_RESTART))

"""The Sentient benchmark (SAGE protocol) of a policy, and paired comparisons of evaluations.

  # tiny, on a CPU in minutes: a run of launch/train.py (or, without a checkpoint, a fresh model)
  .venv/bin/python launch/eval.py --config=configs/eval.py:tiny --config.workdir=runs/eval_tiny \\
      --config.policy.checkpoint=runs/tiny
  # the same run under the rules and lengths it was trained with, not SAGE's
  .venv/bin/python launch/eval.py --config=configs/eval.py:tiny --config.workdir=runs/eval_tiny_like \\
      --config.policy.checkpoint=runs/tiny --config.eval.like_training=runs/tiny
  # a checkpoint of ours, or a served model: see configs/eval.py
  .venv/bin/python launch/eval.py --config=configs/eval.py --config.workdir=DIR --config.eval.profiles=FILE \\
      --config.policy.backend=openai --config.policy.base_url=URL --config.policy.model=NAME \\
      --config.simulator.backend=openai --config.simulator.base_url=URL --config.simulator.model=NAME
  # runs side by side, paired per profile (the first is the baseline); refused (exit 2) when their
  # protocols differ in a field that moves scores, unless --force
  .venv/bin/python launch/eval.py --compare=runs/eval_base,runs/eval_ppo --out=runs/compare_base_ppo

Writes WORKDIR/sentient.json, transcripts.jsonl, report.html (every dialogue, to read), report.md,
trajectories.png and final_emotions.png. Rerunning the same command resumes: finished profiles are
skipped. Exits 2 for a bad config field, a checkpoint that is not there or a mesh the devices do not
fill (before JAX is imported), 1 when every dialogue ended in a simulator error (nothing was scored),
75 when the simulator stayed down past config.simulator.outage_budget_s (the finished dialogues
kept: rerun to resume).

On several hosts run the same command on each (as launch/train.py: launch/tpu_pod.sh, or
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID): each plays its share of the profiles,
process 0 writes the one set of outputs; each process runs its evaluation as a watched child
(rlver_jax/cli/watchdog.py): losing process 0 ends the others with one line and exit 75.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # configs/ and rlver_jax/

from rlver_jax.cli import program  # noqa: E402  (first: one line outside the venv)

from absl import app, flags  # noqa: E402

_CONFIG = program.config_flag("config", None, "Evaluation config file[:preset], e.g. configs/eval.py:tiny.")
_COMPARE = flags.DEFINE_list("compare", None, "Evaluation directories to compare, baseline first (no --config).")
_OUT = flags.DEFINE_string("out", None, "With --compare: directory for compare.md, compare.json, compare.png.")
_CAPABILITIES = flags.DEFINE_list("capabilities", None, "With --compare: one launch/capabilities.py work directory "
                                   "per compared run, same order; compare.md then puts the Sentient score beside "
                                   "MATH500, IFEval and LiveCodeBench in one table.")
_FORCE = flags.DEFINE_bool("force", False, "With --compare: compare runs played under different protocols "
                           "(simulator, rules, profiles, prompts) anyway; every output says MIXED.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; settings go in --config.* flags")
    if _COMPARE.value:
        if _CONFIG.value is not None or not _OUT.value:
            raise app.UsageError("--compare=DIR_A,DIR_B takes --out=DIR and no --config")
        if len(_COMPARE.value) < 2:
            raise app.UsageError(f"--compare={','.join(_COMPARE.value)}: give two or more evaluation directories, "
                                 "the baseline first, separated by commas: --compare=DIR_A,DIR_B")
        from rlver_jax.eval import compare, protocol

        try:
            result = compare.compare_runs(_COMPARE.value, _OUT.value, force=_FORCE.value,
                                          capabilities=_CAPABILITIES.value or ())
        except compare.ProtocolMismatchError as e:
            raise app.UsageError(str(e)) from None
        diff = result["protocol_differences"]
        if diff:
            print(("MIXED protocols, compared under --force: " if result["mixed"] else "protocol fields that differ: ")
                  + protocol.describe(diff, list(diff)))
        print(f"paired over {result['paired_profiles']} profiles: {pathlib.Path(_OUT.value) / 'compare.md'}")
        return
    if _CONFIG.value is None:
        raise app.UsageError("give --config=configs/eval.py[:tiny] (an evaluation) or --compare=DIR_A,DIR_B")
    from rlver_jax.eval import benchmark, policy_source
    from rlver_jax.eval.spec import EvalSpec

    config = _CONFIG.value
    given = program.given_fields()
    if config.eval.like_training:  # the simulator's settings come from the run: its errors are the run's
        spec = EvalSpec.from_config(config, given)
    else:
        spec = program.checked_config(lambda: EvalSpec.from_config(config, given))
    # The policy's checkpoint or directory, and the mesh where the devices are known, before JAX.
    program.checked_config(lambda: policy_source.resolve(spec.policy, spec.seed, spec.settings.max_dialogues))
    if (arguments := spec.distributed.initialize_arguments()) is not None:  # one process of several: watch it
        from rlver_jax.cli import watchdog

        status = watchdog.run_watched(arguments["coordinator_address"], f"config.workdir={spec.workdir}",
                                      keep_runtime_log=program.verbose())
        if status is not None:
            return status
    if benchmark.needs_jax(spec):  # a served policy on one process starts without JAX (~2 s)
        program.checked_config(lambda: program.check_mesh(spec.mesh.shape, spec.distributed))
        import jax

        from rlver_jax.parallel import sharding

        program.enable_compilation_cache(spec.compilation_cache_dir)
        jax.config.update("jax_threefry_partitionable", True)  # the same random draws on any mesh
        sharding.maybe_initialize_distributed(spec.distributed)
        program.checked_config(lambda: sharding.resolve_mesh_shape(spec.mesh.shape, jax.device_count()))
    summary = benchmark.run_benchmark(spec)
    if benchmark.process_index():  # process 0 reports for all
        return
    workdir = pathlib.Path(spec.workdir)
    if "panel" in summary:
        for label, member in summary["panel"].items():
            print(f"{label}: score {member['score']:.1f} [{member['ci95'][0]:.1f}, {member['ci95'][1]:.1f}]  "
                  f"n {member['n']}  simulator errors {member['simulator_errors']}")
        print(f"panel mean score {summary['score']:.1f} over {len(summary['panel'])} simulators  ->  "
              f"{workdir / 'report.md'}")
        return
    errors = summary["simulator_errors"]
    if errors:
        causes = benchmark.simulator_error_causes(workdir)
        cause, count = causes.most_common(1)[0] if causes else ("unknown", errors)
        where = f"the transcripts are in {workdir / benchmark.TRANSCRIPTS}"
        if not summary["n"]:
            raise program.UserError(
                f"every one of the {errors} dialogues ended in a simulator error, so nothing was scored. "
                f"Most common cause ({count}x): {cause}\n{where}")
        print(f"\n*** WARNING: {errors} of {errors + summary['n']} dialogues ended in a simulator error and are "
              f"left out of the score. Most common cause ({count}x): {cause}\n*** {where}\n", file=sys.stderr)
    silent = summary.get("no_policy_turn")
    if silent:
        print(f"\n*** WARNING: {silent} of {silent + errors + summary['n']} dialogues ended before the policy's first "
              f"turn (the simulator's opening filled config.policy.max_total_tokens) and are left out of the score; "
              f"their transcripts are in {workdir / benchmark.TRANSCRIPTS}\n", file=sys.stderr)
    degenerate = summary.get("degenerate_judgements")
    print(f"score {summary['score']:.1f}  success {summary['success']}  failure {summary['failure']}  "
          f"n {summary['n']}  simulator errors {errors}" + (f"  no policy turn {silent}" if silent else "")
          + (f"  DEGENERATE JUDGEMENTS ({degenerate})" if degenerate else "")
          + f"  policy {summary['run']['policy']} ({'think' if summary['run']['think'] else 'no-think'})"
          + f"  ->  {workdir / 'report.html'} (and report.md)")


if __name__ == "__main__":
    program.run(main, statuses=(*program.COMMON_STATUSES, program.EXIT_RESTART))

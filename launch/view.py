"""Pages for reading the dialogues of a run, self-contained HTML that opens from disk.

  # a training run of launch/train.py: RUN_DIR/view/index.html (curves, one row per step) and
  # one page per step's batch (GRPO groups side by side, rewards, advantages) and evaluation
  .venv/bin/python launch/view.py runs/tiny
  # an evaluation of launch/eval.py: WORKDIR/report.html again (eval.py writes it too)
  .venv/bin/python launch/view.py runs/eval_tiny

Rerunning it during a training run writes the pages of the new steps only. --out puts a training
run's pages elsewhere.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # rlver_jax/

from rlver_jax.cli import program  # noqa: E402  (first: one line outside the venv)

from absl import app, flags  # noqa: E402

_OUT = flags.DEFINE_string("out", None, "Training runs: directory for the pages (default RUN_DIR/view).")


def main(argv):
    if len(argv) != 2:
        raise app.UsageError("give one directory: .venv/bin/python launch/view.py RUN_DIR")
    from rlver_jax.eval import html_report, run_view

    run_dir = pathlib.Path(argv[1])
    if (run_dir / "sentient.json").exists() and (run_dir / "transcripts.jsonl").exists():
        page = html_report.rewrite_eval_report(run_dir)
    else:
        page = run_view.write_run_view(run_dir, _OUT.value)
    print(page)


if __name__ == "__main__":
    program.run(main)

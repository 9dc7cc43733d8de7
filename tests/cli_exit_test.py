"""One exit-status table for every launch/ script (rlver_jax/cli/program.EXIT_STATUSES): each
script's --help ends with the rows it can return and exits 0, a bad flag exits 2, a bare
interpreter without the project's packages gets one line naming the venv's (exit 2); docs/cli.md's
table is the same, and docs/faults.md and the README point to it."""

import re
import subprocess
import sys

import pytest

from rlver_jax.cli import program
from tests.conftest import REPO
from tests.fixtures_cli import run_script

SCRIPTS = sorted(p.name for p in (REPO / "launch").glob("*.py"))
# Beyond program.COMMON_STATUSES: 75 where a served model or simulator is called (an outage past its
# budget; training also for a lost peer), 143 where SIGTERM is caught (training saves first).
RESTARTS = {"train.py", "eval.py", "analyze.py", "capabilities.py", "chat_with_simulator.py",
            "simulator_agreement.py"}
TERMINATED = {"train.py"}


def test_every_status_is_a_distinct_documented_code():
    """0 ok, 1 a run failed or a bug, 2 bad input, 75 a temporary failure (rerun to resume), 130 and
    143 interrupted; docs/cli.md's table lists exactly these, each with the same meaning, and the
    pages that mention exit statuses point to it."""
    assert set(program.EXIT_STATUSES) == {0, 1, 2, 75, 130, 143}
    text = (REPO / "docs" / "cli.md").read_text()
    table = text[text.index("| exit | meaning |"):].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", table, re.M))
    assert {int(k): v.replace("`", "") for k, v in rows.items()} == program.EXIT_STATUSES
    for page in (REPO / "README.md", REPO / "docs" / "faults.md"):
        assert "cli.md#exit-statuses" in page.read_text(), page


def test_there_are_scripts():
    assert {"train.py", "eval.py", "plan.py", "view.py", "export_hf.py", "analyze.py", "capabilities.py",
            "chat_with_simulator.py", "fetch_smollm2.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_ends_with_the_statuses_it_can_return_and_exits_0(script):
    """The rows of the table the script can return, in the table's words and order; its examples
    start as the README's commands do."""
    done = run_script(script, "--help")
    assert done.returncode == program.EXIT_OK, done.stderr
    wanted = {*program.COMMON_STATUSES, *((program.EXIT_RESTART,) if script in RESTARTS else ()),
              *((program.EXIT_TERMINATED,) if script in TERMINATED else ())}
    listed = done.stdout[done.stdout.index("Exit status"):].split("\n\n", 1)[0].splitlines()[1:]
    assert listed == [f"  {code:>3}  {meaning}" for code, meaning in program.EXIT_STATUSES.items() if code in wanted]
    examples = re.findall(r"^\s*(\S*python\S*) launch/", done.stdout, re.M)
    assert examples and all(e == ".venv/bin/python" for e in examples), examples
    assert "/tmp/" not in done.stdout  # the README's work directories (runs/...), not scratch paths


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_bad_flag_exits_2_in_one_line(script):
    done = run_script(script, "--no_such_flag=1")
    assert done.returncode == program.EXIT_BAD_INPUT, (done.stdout, done.stderr)
    assert done.stderr.strip().count("\n") == 0 and f"{script}: error:" in done.stderr, done.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_outside_the_venv_one_line_names_the_venv(script):
    """`python3 -S -I` has the standard library alone, as a bare system python does: no absl."""
    done = subprocess.run([sys.executable, "-S", "-I", str(REPO / "launch" / script), "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == program.EXIT_BAD_INPUT, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert f".venv/bin/python launch/{script}" in done.stderr and "'absl' is not installed" in done.stderr

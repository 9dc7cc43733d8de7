"""One exit-status table for every launch/ script (rlver_jax/cli/program.EXIT_STATUSES): each
script's --help ends with it and exits 0, a bad flag exits 2, a bare interpreter without the
project's packages gets one line naming the venv's (exit 2); docs/cli.md's table is the same."""

import re
import subprocess
import sys

import pytest

from rlver_jax.cli import program
from tests.conftest import REPO
from tests.fixtures_cli import run_script

SCRIPTS = sorted(p.name for p in (REPO / "launch").glob("*.py"))


def test_every_status_is_a_distinct_documented_code():
    """The statuses the issues name: 0 ok, 1 a run failed, 2 bad config or input, 75 restart the job
    (a peer lost or preempted), 130 and 143 interrupted; docs/cli.md's table lists exactly these,
    each with the same meaning."""
    assert set(program.EXIT_STATUSES) == {0, 1, 2, 75, 130, 143}
    text = (REPO / "docs" / "cli.md").read_text()
    table = text[text.index("| exit | meaning |"):].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", table, re.M))
    assert {int(k): v.replace("`", "") for k, v in rows.items()} == program.EXIT_STATUSES


def test_there_are_scripts():
    assert {"train.py", "eval.py", "plan.py", "view.py", "export_hf.py", "analyze.py", "capabilities.py",
            "chat_with_simulator.py", "fetch_smollm2.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_ends_with_the_table_and_exits_0(script):
    done = run_script(script, "--help")
    assert done.returncode == program.EXIT_OK, done.stderr
    for code, meaning in program.EXIT_STATUSES.items():
        assert f"{code:>3}  {meaning}" in done.stdout
    examples = re.findall(r"^\s*(\S*python\S*) launch/", done.stdout, re.M)
    assert all(e == ".venv/bin/python" for e in examples), examples


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

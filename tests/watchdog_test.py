"""The launcher's watch of one process of a multi-process run (rlver_jax/cli/watchdog.py), with a
child that writes what JAX's runtime writes when process 0 dies (captured from jaxlib 0.10.2 with
two local processes, docs/faults.md) and aborts: one line naming process 0 and exit 75, the C++
stack held back; any other end of the child passed on as it is. (The real two-process run:
tests/pod_faults_test.py.)"""

import signal
import sys
import textwrap

import pytest

from rlver_jax.cli import watchdog

FATAL = ("F1207 19:45:50.280936   15442 client.h:80] Terminating process because the JAX distributed service "
         "detected fatal errors. This most likely indicates that another task died; see the other task logs for "
         "more details. absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the leader "
         "task was preempted/died/restarted unexpectedly or this task is experiencing network issues.")
POLLED = ("E1207 19:45:50.280885   15442 coordination_service_agent.cc:289] Polled an error from coordination "
          "service (this can be an error from this or another task).")
STACK = ["*** Check failure stack trace: ***", "    @     0x7efe1e440634  absl::log_internal::LogMessage::SendToLog()"]
# The watch forks its child (to set PR_SET_PDEATHSIG) before the launcher imports JAX; a test
# process may have JAX's threads already, of which JAX warns at every fork.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")


def _child(tmp_path, body: str) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text("import os, sys\nw = sys.stderr.write\n" + textwrap.dedent(body))
    return [sys.executable, str(script)]


def test_a_child_aborted_by_the_lost_coordinator_ends_with_one_line_and_75(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv(watchdog.WATCHED_ENV, raising=False)
    command = _child(tmp_path, f"""
        print("step 0 done", flush=True)
        w("train: 40%|####      | 2/5\\r")
        w({POLLED + chr(10)!r}); w("train.py: warning: a line of ours\\n")
        w({POLLED + chr(10)!r}); w({FATAL + chr(10)!r}); w({chr(10).join(STACK) + chr(10)!r}); sys.stderr.flush()
        os.abort()
        """)
    status = watchdog.run_watched("10.0.0.2:1234", "config.workdir=runs/x", command=command)
    out, err = capfd.readouterr()
    assert status == 75 and out == "step 0 done\n"
    # The runtime's lines before one of ours go out with it; from its fatal line on, nothing but ours.
    prog = sys.argv[0].rsplit("/", 1)[-1]
    assert err.split("\n") == [
        "train: 40%|####      | 2/5\r" + POLLED, "train.py: warning: a line of ours",
        f"{prog}: error: process 0 (the coordinator at 10.0.0.2:1234) was lost: the JAX distributed service it ran "
        "stopped answering (its process ended or its host is unreachable), and this process stopped with it. Rerun "
        "the same command on every host to resume (config.workdir=runs/x; exit 75: restart the job)", ""]


def test_any_other_end_of_the_child_is_passed_on(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv(watchdog.WATCHED_ENV, raising=False)
    status = watchdog.run_watched(None, "x", command=_child(tmp_path, f"""
        w({POLLED + chr(10)!r}); w("train.py: error: a full disk\\n"); w({POLLED!r})
        sys.exit(3)
        """))
    err = capfd.readouterr().err
    assert status == 3 and err == f"{POLLED}\ntrain.py: error: a full disk\n{POLLED}"
    status = watchdog.run_watched(None, "x", command=_child(tmp_path, f"""
        w({FATAL.replace("JAX distributed service", "checker")!r} + "\\n"); sys.stderr.flush(); os.abort()
        """))
    assert status == 128 + signal.SIGABRT and "Terminating process because the checker" in capfd.readouterr().err


def test_the_child_does_not_watch_itself(monkeypatch):
    monkeypatch.setenv(watchdog.WATCHED_ENV, "1")
    assert watchdog.run_watched(None, "x") is None


@pytest.mark.parametrize("chunks", [["ab", "c\nE1207 1", "0:00:00.0 1 a.cc:1] x\nok\n"],
                                    ["abc\nE1207 10:00:00.0 1 a.cc:1] x\nok\n"]])
def test_the_filter_holds_the_runtimes_lines_however_they_are_cut(chunks):
    f = watchdog.StderrFilter()
    written = b"".join(f.feed(c.encode()) for c in chunks) + f.finish()
    assert written == b"abc\nE1207 10:00:00.0 1 a.cc:1] x\nok\n"

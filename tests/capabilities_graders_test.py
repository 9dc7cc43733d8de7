"""The graders (the field's libraries behind rlver_jax.eval.capabilities), the data readers, and
the sandbox with a hanging and hostile programs."""

import asyncio
import base64
import json
import pathlib
import pickle
import zlib

import pytest

from tests import capabilities_fixtures as fx

fx.require_extra()

from rlver_jax.eval.capabilities import data, extra, grade_code, grade_ifeval, grade_math, prompts, sandbox  # noqa: E402

FAST = sandbox.Limits(test_timeout_s=1)


@pytest.mark.parametrize("row,reply,right", fx.MATH, ids=[r["unique_id"] for r, *_ in fx.MATH])
def test_math_verify_grades_the_last_box(row, reply, right):
    assert grade_math.grade(reply, row["answer"])["correct"] is right


def test_ifeval_strict_and_loose_per_instruction():
    graded = []
    for row, reply, strict, loose in fx.IFEVAL:
        g = grade_ifeval.grade(reply, row)
        assert g["inst_level_strict_acc"] == strict and g["inst_level_loose_acc"] == loose
        assert g["correct"] is all(strict)
        graded.append(g)
    assert grade_ifeval.aggregate(graded) == pytest.approx(fx.IFEVAL_SCORES, abs=1e-12)


def test_punkt_is_written_locally_and_splits_like_nltk(tmp_path):
    root = extra.punkt_data_dir(tmp_path)
    import nltk

    assert sorted(p.name for p in (root / "tokenizers" / "punkt_tab" / "english").iterdir()) == [
        "abbrev_types.txt", "collocations.tab", "ortho_context.tab", "sent_starters.txt"]
    # "Mr." and "p.m." are among English punkt's abbreviations: three sentences, not five
    assert nltk.sent_tokenize("Mr. Smith came at 5 p.m. on Monday. He left. Then it rained.") == [
        "Mr. Smith came at 5 p.m. on Monday.", "He left.", "Then it rained."]


def test_readers_take_the_published_formats(tmp_path):
    paths = fx.write_all(tmp_path)
    math = data.math500(paths["math500"])
    assert [i.id for i in math] == [r["unique_id"] for r, *_ in fx.MATH]
    ifeval = data.ifeval(paths["ifeval"])
    assert ifeval[0].reference["doc"]["instruction_id_list"] == fx.IFEVAL[0][0]["instruction_id_list"]
    lcb = data.livecodebench(str(tmp_path / "livecodebench"))  # a directory: its files
    io = json.loads(lcb[0].reference["input_output"])
    assert io == {"inputs": ["1 2\n", "10 -4\n", "0 0\n"], "outputs": ["3\n", "6\n", "0\n"], "fn_name": None}
    assert json.loads(lcb[1].reference["input_output"])["fn_name"] == "doubled"
    assert "### Format: You will use the following starter code" in prompts.messages(lcb[1])[1]["content"]


def test_livecodebench_prompt_is_its_own(tmp_path):
    """Our copy of LiveCodeBench's chat prompt equals livecodebench.prompts.code_generation's,
    whose module imports `datasets`: its constants and template function are read from the source."""
    import ast
    import importlib.util
    import types

    source = pathlib.Path(importlib.util.find_spec("livecodebench").origin).parent / "prompts" / "code_generation.py"
    tree = ast.parse(source.read_text())
    wanted = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PromptConstants"
              or isinstance(n, ast.FunctionDef) and n.name == "get_generic_question_template_answer"]
    for n in wanted:
        if isinstance(n, ast.FunctionDef):
            n.args.args[0].annotation = None
    namespace: dict = {}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(source), "exec"), namespace)
    assert prompts.LCB_SYSTEM == namespace["PromptConstants"].SYSTEM_MESSAGE_GENERIC
    for starter in ("", "class Solution:\n    def f(self) -> int:\n        "):
        q = types.SimpleNamespace(question_content="Add two numbers.", starter_code=starter)
        assert prompts.lcb_question(q.question_content, starter) == \
            namespace["get_generic_question_template_answer"](q)


def test_compressed_private_tests_refuse_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    evil = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        data.private_tests(evil)


def test_missing_fields_name_the_format(tmp_path):
    path = fx.write_jsonl(tmp_path / "m.jsonl", [{"question": "x"}])
    with pytest.raises(data.DataError, match=r"lacks \['problem', 'answer'\]"):
        data.math500(path)


def test_code_extraction_and_passing_and_failing_programs():
    good, bad = fx.LCB[0], fx.LCB[1]
    io_good = json.dumps({"inputs": ["1 2\n", "10 -4\n"], "outputs": ["3\n", "6\n"], "fn_name": None})
    io_bad = json.dumps({"inputs": ["[1, 2]"], "outputs": ["[2, 4]"], "fn_name": "doubled"})
    r1 = asyncio.run(grade_code.grade(good[1], io_good, FAST))
    r2 = asyncio.run(grade_code.grade(bad[1], io_bad, FAST))
    assert (r1["correct"], r1["results"]) == (True, [True, True])
    assert r2["correct"] is False
    assert grade_code.pass_at_1([r1["correct"], r2["correct"]]) == 0.5
    assert asyncio.run(grade_code.grade("no code here", io_good, FAST))["error"] == "no code block in the reply"


def test_pass_at_k_from_verdicts_equals_the_formula():
    # 1 - C(n - c, k) / C(n, k): 3 generations, 1 right -> pass@2 = 1 - 1/3; none right -> 0; all -> 1.
    assert grade_code.pass_at_k([[True, False, False], [False, False, False], [True, True, True]], 2) == \
        pytest.approx((2 / 3 + 0 + 1) / 3)
    assert grade_code.pass_at_1([True, False, False, False, True, False]) == pytest.approx(2 / 6)
    assert grade_code.pass_at_1([False] * 5) == 0.0
    with pytest.raises(ValueError, match="at least 2 generations"):
        grade_code.pass_at_k([[True]], 2)


SUM_IO = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"], "fn_name": None})
SUM = "a, b = map(int, input().split())\nprint(a + b)\n"


def _run(code: str) -> sandbox.Outcome:
    return asyncio.run(sandbox.run_program(code, SUM_IO, FAST))


@pytest.mark.slow
def test_a_program_that_never_ends_fails_within_its_limit():
    import time

    start = time.monotonic()
    out = _run("while True:\n    pass\n")  # LiveCodeBench's own alarm stops it: time limit exceeded
    assert out.results == [-3] and not out.killed
    # one that ignores the alarm runs into the sandbox's wall-clock limit and is killed with its session
    out = _run("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n")
    assert out.results == [-1] and out.killed
    assert time.monotonic() - start < 1 + FAST.wall_s(1) + 4


@pytest.mark.parametrize("name,code", [
    ("os.system", "import os\nos.system('touch {target}')\n"),
    ("subprocess", "import subprocess\nsubprocess.run(['touch', '{target}'])\n"),
    ("write outside", "open('{target}', 'w').write('x')\n"),
    ("os.open outside", "import os\nos.close(os.open('{target}', os.O_CREAT | os.O_WRONLY))\n"),
    ("fork", "import os\nif os.fork() == 0:\n    open('{target}', 'w').write('x')\n"),
    ("ctypes", "import ctypes\nctypes.CDLL(None).system(b'touch {target}')\n"),
    # no audit event covers _posixsubprocess: the kernel's seccomp filter refuses the fork
    ("_posixsubprocess", "import _posixsubprocess, os\nr, w = os.pipe()\n_posixsubprocess.fork_exec("
     "[b'/usr/bin/touch', b'{target}'], [b'/usr/bin/touch'], True, (w,), None, None, -1, -1, -1, -1, -1, -1, "
     "r, w, True, False, -1, None, None, None, -1, None, False)\nimport time\ntime.sleep(0.5)\n"),
    ("dir_fd", "import os\nfd = os.open('{target.parent}', os.O_RDONLY)\n"
     "os.close(os.open('{target.name}', os.O_CREAT | os.O_WRONLY, dir_fd=fd))\n"),
    ("symlink out", "import os\nos.symlink('{target.parent}', 'out')\nopen('out/{target.name}', 'w').write('x')\n"),
])
def test_hostile_programs_fail_and_harm_nothing(tmp_path, name, code):
    target = tmp_path / "harmed"
    out = _run(code.format(target=target) + SUM)
    assert out.results != [True] and not target.exists(), name


def test_the_kernel_refuses_processes_and_sockets_without_the_audit_hook():
    """The seccomp layer alone (no audit hook in this child): fork, exec and socket fail, threads run."""
    import platform
    import subprocess
    import sys

    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("seccomp filter: Linux on x86-64 or AArch64 only")
    child = pathlib.Path(sandbox.__file__).with_name("sandbox_child.py")
    script = (f"import runpy, os, socket, threading\nns = runpy.run_path({str(child)!r})\n"
              "assert ns['seccomp_filter']()\nt = threading.Thread(target=print, args=('thread ran',))\n"
              "t.start(); t.join()\n"
              "for name, call in (('fork', os.fork), ('exec', lambda: os.execv('/bin/true', ['true'])),\n"
              "                   ('socket', socket.socket)):\n"
              "    try:\n        call()\n        print(name, 'allowed')\n"
              "    except PermissionError:\n        print(name, 'refused')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n")[:4] == ["thread ran", "fork refused", "exec refused", "socket refused"], done


def test_the_kernel_allows_writes_only_in_the_scratch_directory_without_the_audit_hook(tmp_path):
    """The Landlock layer alone: a write outside the directory fails, inside it works (sqlite3
    opens its files in C, past any audit of `open`)."""
    import subprocess
    import sys

    child = pathlib.Path(sandbox.__file__).with_name("sandbox_child.py")
    inside, outside = tmp_path / "scratch", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    script = (f"import runpy, sqlite3\nns = runpy.run_path({str(child)!r})\n"
              f"if not ns['landlock_writes_only_in']({str(inside)!r}):\n"
              "    print('no landlock')\n    raise SystemExit\n"
              f"sqlite3.connect({str(inside / 'ok.db')!r}).execute('create table t (x)')\n"
              f"for path in ({str(outside / 'x.txt')!r}, {str(outside / 'x.db')!r}):\n"
              "    try:\n        (sqlite3.connect(path).execute('create table t (x)') if path.endswith('.db')\n"
              "         else open(path, 'w'))\n        print('allowed')\n"
              "    except (PermissionError, sqlite3.OperationalError):\n        print('refused')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    if done.stdout.strip() == "no landlock":
        pytest.skip("this kernel has no Landlock")
    assert done.stdout.split() == ["refused", "refused"], done
    assert (inside / "ok.db").exists() and not list(outside.iterdir())


def test_no_network():
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        out = _run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n" + SUM)
        assert out.results != [True]
        server.settimeout(0.2)
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


def test_writes_inside_the_scratch_directory_and_threads_are_allowed():
    out = _run("open('notes.txt', 'w').write('x')\nimport threading\nt = threading.Thread(target=print)\n"
               "t.start()\nt.join()\n" + SUM)
    assert out.results == [True]
    import platform

    if platform.system() == "Linux" and platform.machine() in ("x86_64", "aarch64"):
        assert out.layers["seccomp"]

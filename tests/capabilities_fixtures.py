"""Small data sets in the published formats of MATH-500, IFEval and LiveCodeBench
(code_generation_lite, private tests in their compressed form), written by the tests, with the
replies a scripted policy gives and the scores the field's graders must give them."""

from __future__ import annotations

import base64
import json
import pathlib
import pickle
import zlib

import pytest

EXTRA_MODULES = ("math_verify", "lm_eval", "livecodebench", "nltk", "langdetect", "immutabledict", "punkt")


def require_extra() -> None:
    """Skip, naming the extra, when a grader's library is missing."""
    import importlib.util

    missing = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the 'capabilities' extra is not installed (missing {missing}): "
                    "pip install -e '.[capabilities]'", allow_module_level=True)


MATH = [  # (row, reply, right?)
    ({"problem": "What is 3/4 as a decimal?", "solution": "...", "answer": "\\frac{3}{4}", "subject": "Prealgebra",
      "level": 1, "unique_id": "test/prealgebra/1.json"}, "3 divided by 4 is \\boxed{0.75}.", True),
    ({"problem": "What is 2+4?", "solution": "...", "answer": "6", "subject": "Prealgebra", "level": 1,
      "unique_id": "test/prealgebra/2.json"}, "2+4 = \\boxed{5}", False),
    ({"problem": "Convert the point $(0,3)$ to polar coordinates.", "solution": "...",
      "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
      "unique_id": "test/precalculus/807.json"},
     "At first I wrote \\boxed{(3, 0)} but that puts the point on the wrong axis entirely, so after checking "
     "the angle again the final answer is \\boxed{\\left(3, \\frac{\\pi}{2}\\right)}", True),
]

IFEVAL = [  # (row, reply, strict per instruction, loose per instruction)
    ({"key": 1, "prompt": "Write a greeting in lowercase letters only, without commas.",
      "instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"], "kwargs": [{}, {}]},
     "hello there my friend. everything is going well today and the weather is lovely.", [True, True],
     [True, True]),
    ({"key": 2, "prompt": "Say hello to the world in lowercase, with no commas.",
      "instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"], "kwargs": [{}, {}]},
     "Hello, World", [False, False], [False, False]),
    ({"key": 3, "prompt": "Describe the sea in lowercase and without any commas.",
      "instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"], "kwargs": [{}, {}]},
     "Sure, here it is:\nthe sea is wide and blue and calm under the morning sun", [False, False], [True, True]),
]
# lm-eval's ifeval metrics of those replies, counted by hand from the lists above
IFEVAL_SCORES = {"prompt_level_strict_acc": 1 / 3, "instruction_level_strict_acc": 2 / 6,
                 "prompt_level_loose_acc": 2 / 3, "instruction_level_loose_acc": 4 / 6}


def compress_tests(tests: list[dict]) -> str:
    """code_generation_lite's private_test_cases: base64(zlib(pickle(JSON string)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def _lcb_row(qid: str, content: str, starter: str, public: list[dict], private: list[dict],
             func: str | None) -> dict:
    return {"question_title": f"problem {qid}", "question_content": content, "platform": "atcoder",
            "question_id": qid, "contest_id": "c1", "contest_date": "2025-01-01T00:00:00", "starter_code": starter,
            "difficulty": "easy", "public_test_cases": json.dumps(public),
            "private_test_cases": compress_tests(private),
            "metadata": json.dumps({"func_name": func} if func else {})}


LCB = [  # (row, reply, passes?)
    (_lcb_row("abc001_a", "Read two integers and print their sum.", "",
              [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}],
              [{"input": "10 -4\n", "output": "6\n", "testtype": "stdin"},
               {"input": "0 0\n", "output": "0\n", "testtype": "stdin"}], None),
     "Here is my solution.\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\n", True),
    (_lcb_row("lc_double", "Return every number doubled.",
              "class Solution:\n    def doubled(self, nums: List[int]) -> List[int]:\n        ",
              [{"input": "[1, 2]", "output": "[2, 4]", "testtype": "functional"}],
              [{"input": "[0, 5]", "output": "[0, 10]", "testtype": "functional"}], "doubled"),
     "```python\nclass Solution:\n    def doubled(self, nums: List[int]) -> List[int]:\n"
     "        return [x + x + 1 for x in nums]\n```", False),
]


def write_jsonl(path: pathlib.Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_all(root: pathlib.Path) -> dict[str, str]:
    return {"math500": write_jsonl(root / "math500" / "test.jsonl", [r for r, *_ in MATH]),
            "ifeval": write_jsonl(root / "ifeval" / "ifeval_input_data.jsonl", [r for r, *_ in IFEVAL]),
            "livecodebench": write_jsonl(root / "livecodebench" / "test.jsonl", [r for r, *_ in LCB])}


def replies() -> dict[str, str]:
    """The scripted policy's reply to each item, by a text the item's prompt contains."""
    out = {r["problem"]: reply for r, reply, _ in MATH}
    out.update({r["prompt"]: reply for r, reply, *_ in IFEVAL})
    out.update({r["question_content"]: reply for r, reply, _ in LCB})
    return out


def answer_for(request: dict, table: dict[str, str], wrap=lambda s: s) -> str:
    text = request["messages"][-1]["content"]
    for needle, reply in table.items():
        if needle in text:
            return wrap(reply)
    raise AssertionError(f"no scripted reply for {text[:80]!r}")

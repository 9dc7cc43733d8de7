"""LiveCodeBench code generation, graded by nvidia-livecodebench's evaluation: the program is
the reply's last fenced code block (livecodebench.utils.extraction_utils.extract_code, the
OpenAI-chat style), run on every public and private test by livecodebench's `run_test` inside
rlver_jax.eval.capabilities.sandbox; an item passes when every test does (and it has a test result:
no program, no pass). pass@k is livecodebench's estimator (`estimate_pass_at_k`) over the per-item
verdicts, the same `correct` values the counts and the comparison read (one generation each:
greedy), so a reply graded wrong (no code block, thinking never closed) is no pass anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlver_jax.eval.capabilities import extra, sandbox


def extract_program(reply: str) -> str:
    extraction = extra.livecodebench_module("utils.extraction_utils")
    styles = extra.livecodebench_module("lm_styles")
    return extraction.extract_code(reply, styles.LMStyle.OpenAIChat)


async def grade(reply: str, input_output: str, limits: sandbox.Limits) -> dict[str, Any]:
    """{"correct", "program", "results", "error"} of one reply to one problem."""
    program = extract_program(reply)
    if not program:
        return {"correct": False, "program": "", "results": [], "error": "no code block in the reply"}
    outcome = await sandbox.run_program(program, input_output, limits)
    passed = extra.livecodebench_module("evaluation.pass_k_utils").extract_instance_results({0: [outcome.results]})
    return {"correct": bool(outcome.results) and bool(passed[0][0]), "program": program, "results": outcome.results,
            "error": outcome.metadata.get("error_message") or outcome.metadata.get("error") or "",
            "wall_s": round(outcome.wall_s, 3), "killed": outcome.killed, "sandbox": outcome.layers}


def pass_at_k(verdicts: Sequence[Sequence[bool]], k: int) -> float:
    """livecodebench's pass@k, the mean over problems of 1 - C(n - c, k) / C(n, k), from each
    problem's verdicts (one per generation: n of them, c true); needs n >= k everywhere."""
    if not verdicts:
        raise ValueError("pass@k of no problem")
    if any(len(v) < k for v in verdicts):
        raise ValueError(f"pass@{k} needs at least {k} generations of every problem")
    estimate = extra.livecodebench_module("evaluation.pass_k_utils").estimate_pass_at_k
    return float(estimate([len(v) for v in verdicts], [sum(map(bool, v)) for v in verdicts], k).mean())


def pass_at_1(verdicts: Sequence[bool]) -> float:
    """pass@1 of one generation per problem, from each problem's verdict (its `correct`)."""
    return pass_at_k([[v] for v in verdicts], 1)

"""LiveCodeBench code generation, graded by nvidia-livecodebench's evaluation: the program is
the reply's last fenced code block (livecodebench.utils.extraction_utils.extract_code, the
OpenAI-chat style), run on every public and private test by livecodebench's `run_test` inside
rlver_jax.eval.capabilities.sandbox; an item passes when every test does, and pass@1 is
livecodebench's `compute_metrics_from_results` over the items (one generation each: greedy).
"""

from __future__ import annotations

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
    return {"correct": bool(passed[0][0]), "program": program, "results": outcome.results,
            "error": outcome.metadata.get("error_message") or outcome.metadata.get("error") or "",
            "wall_s": round(outcome.wall_s, 3), "killed": outcome.killed, "sandbox": outcome.layers}


def pass_at_1(results: list[list[Any]]) -> float:
    """livecodebench's pass@1 of one generation per problem (`results`: each problem's test results)."""
    metrics = extra.livecodebench_module("evaluation.pass_k_utils").compute_metrics_from_results(
        dict(enumerate([[r] for r in results])), k_list=[1])
    return float(metrics["pass@1"])

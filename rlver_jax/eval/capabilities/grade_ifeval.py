"""IFEval, graded by lm-evaluation-harness's ifeval task (its instruction verifiers, Google's):
`process_results` per reply gives strict and loose following, per prompt and per instruction;
the aggregates are the task's: prompt level the mean over prompts, instruction level
`agg_inst_level_acc` over every instruction of every prompt."""

from __future__ import annotations

from typing import Any

from rlver_jax.eval.capabilities import extra

KEYS = ("prompt_level_strict_acc", "inst_level_strict_acc", "prompt_level_loose_acc", "inst_level_loose_acc")


def grade(reply: str, doc: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's four results of one reply to one IFEval prompt (`doc`: key, prompt,
    instruction_id_list, kwargs), plus "correct" (strict, prompt level)."""
    out = extra.ifeval_utils().process_results(doc, [reply])
    out = {k: (list(map(bool, out[k])) if k.startswith("inst") else bool(out[k])) for k in KEYS}
    return {"correct": out["prompt_level_strict_acc"], **out}


def aggregate(graded: list[dict[str, Any]]) -> dict[str, float]:
    """The task's metrics over graded replies: prompt_level_{strict,loose}_acc and
    instruction_level_{strict,loose}_acc (lm-eval's inst_level_*_acc)."""
    utils = extra.ifeval_utils()
    n = len(graded)
    return {
        "prompt_level_strict_acc": sum(g["prompt_level_strict_acc"] for g in graded) / n,
        "instruction_level_strict_acc": utils.agg_inst_level_acc([g["inst_level_strict_acc"] for g in graded]),
        "prompt_level_loose_acc": sum(g["prompt_level_loose_acc"] for g in graded) / n,
        "instruction_level_loose_acc": utils.agg_inst_level_acc([g["inst_level_loose_acc"] for g in graded]),
    }

"""MATH500, graded by math-verify: the gold answer (the data's `answer`, LaTeX) against the
reply's last \\boxed{} (math-verify's LaTeX extraction with boxed answers first, as lighteval's
MATH-500 task; matches are tried from the end), equal when math-verify's `verify` says so
(0.75 equals \\frac{3}{4})."""

from __future__ import annotations

from typing import Any

from rlver_jax.eval.capabilities import extra


def grade(reply: str, answer: str) -> dict[str, Any]:
    """{"correct", "extracted"} of one reply against the gold answer."""
    mv = extra.math_verify()
    gold = mv.parse(f"${answer}$", extraction_config=[mv.LatexExtractionConfig()])
    pred = mv.parse(reply, extraction_config=[mv.LatexExtractionConfig(boxed_match_priority=0),
                                              mv.ExprExtractionConfig()])
    return {"correct": bool(pred) and bool(mv.verify(gold, pred)), "extracted": str(pred[-1]) if pred else ""}

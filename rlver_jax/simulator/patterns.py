"""Regular expressions that more than one module matches text with."""

import re

# A Chinese (CJK unified ideograph) character: language detection (profiles.py) and the
# embedded simulator's word units (embedded.py).
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# A <think>...</think> block, removed before parsing a simulator's (parsing.py) or a judge's
# (eval/llm_judge.py) answer.
THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)

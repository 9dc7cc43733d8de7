"""What the policy is asked: one user message per item (LiveCodeBench: its system message too),
and in think mode a system instruction to think inside <think></think> first. The settings are
ours (the paper does not publish its own); each follows the benchmark's common practice:

- MATH500: the problem and Qwen2.5-Math's chain-of-thought instruction to box the answer.
- IFEval: the prompt as it is (lm-eval's ifeval task sends `prompt` alone).
- LiveCodeBench: its prompt for chat models (livecodebench.prompts.code_generation,
  format_prompt_generation with LMStyle.OpenAIChat: SYSTEM_MESSAGE_GENERIC and
  get_generic_question_template_answer), spelled out here because that module imports
  `datasets` for a type.
"""

from __future__ import annotations

from rlver_jax.eval.capabilities.data import Item

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
LCB_SYSTEM = ("You are an expert Python programmer. You will be given a question (problem specification) and "
              "will generate a correct Python program that matches the specification and passes all tests.")
LCB_WITH_STARTER = ("You will use the following starter code to write the solution to the problem and enclose "
                    "your code within delimiters.")
LCB_WITHOUT_STARTER = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not "
                       "directly test on the sample inputs). Enclose your code within delimiters as follows. "
                       "Ensure that when the python program runs, it reads the inputs, runs the algorithm and "
                       "writes output to STDOUT.")


def lcb_question(content: str, starter_code: str) -> str:
    prompt = f"### Question:\n{content}\n\n"
    if starter_code:
        prompt += f"### Format: {LCB_WITH_STARTER}\n```python\n{starter_code}\n```\n\n"
    else:
        prompt += f"### Format: {LCB_WITHOUT_STARTER}\n```python\n# YOUR CODE HERE\n```\n\n"
    return prompt + "### Answer: (use the provided format with backticks)\n\n"


def messages(item: Item, think_instruction: str = "") -> list[dict[str, str]]:
    """The chat messages for `item`; `think_instruction` (think mode) joins the system message."""
    q = item.question
    if item.benchmark == "math500":
        system, user = "", f"{q['problem']}\n{MATH_INSTRUCTION}"
    elif item.benchmark == "ifeval":
        system, user = "", q["prompt"]
    else:
        system, user = LCB_SYSTEM, lcb_question(q["question_content"], q["starter_code"])
    system = "\n\n".join(s for s in (system, think_instruction) if s)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]

"""RLVER GRPO, think-then-say:
`.venv/bin/python launch/train.py --config=configs/grpo_think.py[:tiny|smol|0.5b|7b|7b_lora]`."""

from configs.base import get_base_config, parse_preset


def get_config(arg: str | None = None):
    return get_base_config(parse_preset(arg), algo="grpo", think=True)

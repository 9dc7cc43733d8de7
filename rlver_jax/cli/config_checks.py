"""The range checks of a training or evaluation config (`check_config`), before anything starts;
apart from rlver_jax.train.run so that an evaluation of served models checks its config without
importing JAX or transformers."""

from __future__ import annotations

import ml_collections

# The lowest value of every count, size and sampling number a run reads (training or evaluation
# config), checked before anything starts; fields absent from a config are skipped.
_LOWEST = {
    "train.steps": 0, "train.eval_every": 0, "train.eval_max_profiles": 0, "train.length_multiple": 1,
    "rollout.n": 1, "rollout.profiles_per_step": 1, "rollout.max_new_tokens": 1, "rollout.max_total_tokens": 1,
    "rollout.temperature": 0, "rollout.top_k": 0, "rollout.cache_slots": 0, "rollout.max_staleness": 0,
    "rollout.pipeline_groups": 1, "checkpoint.save_every": 1, "checkpoint.keep": 1,
    "eval.max_dialogues": 1, "eval.group_size": 1, "eval.max_profiles": 0,
    "policy.temperature": 0, "policy.top_k": 0, "policy.max_new_tokens": 1, "policy.max_total_tokens": 1,
    "policy.cache_slots": 0, "policy.max_retries": 0, "policy.backoff_initial_s": 0, "policy.backoff_max_s": 0,
    "simulator.temperature": 0, "simulator.max_tokens": 1, "simulator.max_concurrency": 1,
    "simulator.max_retries": 0, "simulator.backoff_initial_s": 0, "simulator.backoff_max_s": 0,
    "simulator.malformed_retries": 0, "simulator.max_change": 0, "simulator.max_turns": 1,
}
_POSITIVE = ("simulator.timeout_s", "policy.timeout_s")  # seconds: > 0
_FRACTION = ("rollout.top_p", "policy.top_p")  # in (0, 1]


def check_config(config: ml_collections.ConfigDict) -> None:
    """Every sampling, simulator, size and count field of a training or evaluation config in its
    range, before any file, model or server is touched: one ValueError naming each bad field."""
    problems = []
    for field in (*_LOWEST, *_POSITIVE, *_FRACTION):
        section, name = field.split(".")
        if section not in config or name not in config[section]:
            continue
        value = config[section][name]
        if field in _LOWEST and value < _LOWEST[field]:
            problems.append(f"config.{field}={value} must be >= {_LOWEST[field]}")
        elif field in _POSITIVE and not value > 0:
            problems.append(f"config.{field}={value} must be > 0")
        elif field in _FRACTION and not 0 < value <= 1:
            problems.append(f"config.{field}={value} must be in (0, 1] (1 is off)")
    if problems:
        raise ValueError("; ".join(problems))

"""The range checks of a training or evaluation config (`check_config`), before anything starts;
apart from rlver_jax.train.run so that an evaluation of served models checks its config without
importing JAX or transformers."""

from __future__ import annotations

import ml_collections

from rlver_jax.rollout.cache_bound import session_slots

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


# The sampling sections of a config: (prefix, section) for training's rollout, its in-loop
# evaluation's policy and an evaluation's policy.
def _sampling_sections(config: ml_collections.ConfigDict) -> list[tuple[str, ml_collections.ConfigDict]]:
    found = [(name, config[name]) for name in ("rollout", "policy") if name in config]
    if "train" in config and "eval_policy" in config.train:
        found.append(("train.eval_policy", config.train.eval_policy))
    return found


def consistency_problems(config: ml_collections.ConfigDict) -> list[str]:
    """What of a config's cache, length and batch settings contradicts another (each in range:
    `check_config`): a KV cache below what a session can need (rlver_jax.rollout.cache_bound;
    a run survives it by encoding such turns afresh, but a preset must not ship it), a turn longer
    than its row, a step's dialogues that do not split into mini-batches of micro-batches, more
    pipeline groups than dialogues. Every preset returns none (tests/presets_test.py)."""
    problems = []
    for name, s in _sampling_sections(config):
        if not {"max_new_tokens", "max_total_tokens"} <= set(s):
            continue
        if s.max_new_tokens >= s.max_total_tokens:
            problems.append(f"config.{name}.max_new_tokens={s.max_new_tokens} leaves no room for a prompt in "
                            f"config.{name}.max_total_tokens={s.max_total_tokens}")
        need = session_slots(s.max_total_tokens, s.max_new_tokens)
        if s.get("cache_slots", 0) and s.cache_slots < need:
            problems.append(f"config.{name}.cache_slots={s.cache_slots} is below the {need} slots a session of "
                            f"max_total_tokens={s.max_total_tokens} and max_new_tokens={s.max_new_tokens} can "
                            f"need: set it to {need} (or 0)")
    if {"rollout", "rl", "train"} <= set(config):
        r, rl = config.rollout, config.rl
        dialogues = r.profiles_per_step * r.n
        mini = rl.mini_batch_size or dialogues
        if dialogues % mini:
            problems.append(f"{dialogues} dialogues per step (config.rollout.profiles_per_step x n) are not a "
                            f"multiple of config.rl.mini_batch_size={mini}")
        if mini % min(rl.micro_batch_size, mini):
            problems.append(f"config.rl.mini_batch_size={mini} is not a multiple of "
                            f"config.rl.micro_batch_size={rl.micro_batch_size}")
        if rl.algo == "grpo" and r.n < 2:
            problems.append(f"config.rl.algo='grpo' needs config.rollout.n >= 2 (got {r.n})")
        if r.pipeline_groups > dialogues:
            problems.append(f"config.rollout.pipeline_groups={r.pipeline_groups} is more than the {dialogues} "
                            "dialogues of a step")
    return problems

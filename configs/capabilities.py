"""Capability retention (MATH500, IFEval, LiveCodeBench):
`.venv/bin/python launch/capabilities.py --config=configs/capabilities.py`.

The policy section is configs/eval.py's (the same fields, defaults and meaning), but greedy and
with room for worked answers; the data are local files in the published formats (fetch them once
with `.venv/bin/python launch/capabilities.py --fetch_data=DIR`); any subset of the three may be given.

A 7B export served by SGLang (docs/capabilities.md), then the base model, then the comparison:
  .venv/bin/python launch/capabilities.py --config=configs/capabilities.py --config.workdir=runs/caps_ppo \\
      --config.policy.backend=openai --config.policy.base_url=http://policyhost:30000/v1 \\
      --config.policy.model=policy --config.policy.think=True \\
      --config.data.math500=data/caps/math500/test.jsonl \\
      --config.data.ifeval=data/caps/ifeval/ifeval_input_data.jsonl \\
      --config.data.livecodebench=data/caps/livecodebench
  .venv/bin/python launch/capabilities.py --config=configs/capabilities.py --config.workdir=runs/caps_ppo \\
      ... --config.compare_to=runs/caps_base
Presets:
  default: the settings above; policy and data are yours to point at.
  tiny: CPU, minutes: the tiny policy (a checkpoint of a tiny run, or a fresh one), 32 new tokens.
        A smoke test of the pipeline, not a benchmark.
"""

import ml_collections

from configs.eval import get_config as get_eval_config

PRESETS = ("default", "tiny")
THINK_INSTRUCTION = ("Think the problem through first, inside <think> and </think>; after </think>, "
                     "write only your answer.")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    preset = arg or "default"
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; use one of {PRESETS} (e.g. configs/capabilities.py:tiny)")
    tiny = preset == "tiny"
    shared = get_eval_config("tiny" if tiny else "sage")
    c = ml_collections.ConfigDict()
    c.workdir = ""  # required: capabilities.json, items.jsonl, report.md and capabilities.html go here
    c.seed = shared.seed  # sampling key of a JAX policy; the init of a fresh tiny policy
    c.compilation_cache_dir = shared.compilation_cache_dir  # as configs/eval.py
    # a finished run of the base model (its WORKDIR): write compare_capabilities.{json,md} here; "" = none
    c.compare_to = ""

    c.data = ml_collections.ConfigDict()
    c.data.math500 = ""  # HuggingFaceH4/MATH-500 test.jsonl (or .parquet); "" = skip
    c.data.ifeval = ""  # google/IFEval ifeval_input_data.jsonl (or .parquet); "" = skip
    # livecodebench/code_generation_lite: a file, or a directory of them (release_v6: test.jsonl ... test6.jsonl)
    c.data.livecodebench = ""

    c.eval = ml_collections.ConfigDict()
    c.eval.max_examples = 0  # per benchmark: 0 = all, else the first N
    # requests in flight at once; an openai policy's client limit, so it is filled (a JAX policy
    # samples eval.group_size items per call)
    c.eval.max_in_flight = 16 if tiny else 64
    c.eval.group_size = 8  # items per JAX sampler call
    c.eval.think_instruction = THINK_INSTRUCTION  # think mode: the system message asking for <think> first

    # The policy: configs/eval.py's section, with greedy decoding and longer answers.
    c.policy = shared.policy
    c.policy.temperature = 0.0  # greedy (both backends)
    c.policy.max_new_tokens = 32 if tiny else 4096  # per answer (think mode: thinking included)
    c.policy.cache_slots = 0  # one-turn chats keep nothing between turns
    c.mesh = shared.mesh

    c.code = ml_collections.ConfigDict()  # LiveCodeBench: how generated programs run (sandbox.py)
    # seconds per test case (LiveCodeBench's default); a program's wall limit is (this + 1) x tests + 5 s
    c.code.test_timeout_s = 6
    c.code.memory_mb = 4096  # address-space limit of a program's process
    c.code.file_mb = 16  # largest file a program may write, in its scratch directory
    c.code.max_processes = 64  # RLIMIT_NPROC (forks are refused anyway)
    c.code.workers = 2  # programs run at once
    c.code.scratch_dir = ""  # where each program's scratch directory is made; "" = the system's temp directory
    return c

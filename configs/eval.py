"""The Sentient benchmark under the SAGE protocol:
`.venv/bin/python launch/eval.py --config=configs/eval.py[:tiny|smol]`.

The simulated user opens with each profile's `first_talk`, starts at emotion 40, and the dialogue
ends on a goodbye, at 100 (success), below 10 (failure) or after 10 rounds, the 10th reply not
judged (configs/simulator.py with eval_mode=True).

A checkpoint of ours, on a served simulator, with the 100 SAGE test profiles:
  .venv/bin/python launch/eval.py --config=configs/eval.py --config.workdir=runs/eval_ppo_think \\
      --config.policy.checkpoint=runs/ppo_think_7b \\
      --config.eval.profiles=../shared/data/rlver/test_profile.jsonl \\
      --config.simulator.base_url=http://simhost:30000/v1 --config.simulator.model=simulator
A served or API model (the key, if any, in the environment variable policy.api_key_env names):
  .venv/bin/python launch/eval.py --config=configs/eval.py --config.workdir=runs/eval_qwen7b \\
      --config.eval.profiles=../shared/data/rlver/test_profile.jsonl \\
      --config.policy.backend=openai --config.policy.base_url=http://policyhost:8000/v1 \\
      --config.policy.model=Qwen2.5-7B-Instruct \\
      --config.simulator.backend=openai --config.simulator.base_url=http://simhost:30000/v1 \\
      --config.simulator.model=simulator
Presets:
  sage (default): the protocol above; policy and simulator are yours to point at.
  tiny: CPU, minutes: the tiny policy of a training run (--config.policy.checkpoint=RUN), or a
        freshly initialised one when no checkpoint is given; the embedded rule-based simulator and
        the project's own profiles. A smoke test of the pipeline, not a benchmark. SAGE's rules
        (10 rounds, initial emotion 40) are not those of a tiny training run (1 round in think
        mode, 48-token turns, initial emotion 30); to score a run under its own rules add
        --config.eval.like_training=RUN (docs/cli.md).
  smol: CPU, the tiny preset's lengths and simulator with the real SmolLM2-135M-Instruct of
        `.venv/bin/python launch/fetch_smollm2.py` (policy.path), or a smol training run's --config.policy.checkpoint;
        English profiles only: the SMOL_HOLDOUT profiles the smol training presets hold out
        (configs/base.py), so base against trained is a held-out comparison.
"""

import pathlib

import ml_collections
from ml_collections import config_dict

from configs.mesh import get_mesh_config
from configs.simulator import get_simulator_config
from rlver_jax.models import smollm2
from rlver_jax.sampling.cache_bound import session_slots

PRESETS = ("sage", "tiny", "smol")
# The project's own profiles (rlver_jax.simulator.profiles.DEFAULT_PROFILES, which
# tests/cli_test.py checks this equals): spelled out, because importing the simulator package
# (openai, httpx) would cost every --help of launch/eval.py two seconds.
SHIPPED_PROFILES = pathlib.Path(__file__).resolve().parents[1] / "rlver_jax" / "simulator" / "data" / "profiles.jsonl"
# The project's English profiles (rlver_jax.simulator.profiles.ENGLISH_PROFILES), the smol presets' only ones:
# SmolLM2-135M-Instruct is an English model and answers Chinese profiles with gibberish.
ENGLISH_PROFILES = SHIPPED_PROFILES.with_name("profiles_en.jsonl")
# The last SMOL_HOLDOUT of ENGLISH_PROFILES: held out of smol training (configs/base.py, data.eval_holdout)
# and the smol evaluation's profiles. 16 (two of each hidden goal, all three personality types), so
# a difference between base and trained can show; the rest (24) are trained on.
SMOL_HOLDOUT = 16
# The last TINY_HOLDOUT of SHIPPED_PROFILES: held out of tiny training (configs/base.py, data.eval_holdout)
# and the tiny evaluation's profiles, so a tiny run is scored on profiles it never trained on.
TINY_HOLDOUT = 4


def get_policy_sampling_config(*, tiny: bool = False) -> ml_collections.ConfigDict:
    """How the benchmark's policy writes its turns; also the in-loop evaluation's (configs/base.py),
    so a training run's eval_score is comparable with launch/eval.py's score."""
    c = ml_collections.ConfigDict()
    c.temperature = 0.7  # both backends
    c.top_p = 1.0  # jax only
    c.top_k = 0  # jax only; 0 = off
    c.max_new_tokens = 32 if tiny else 2048  # per policy turn
    c.max_total_tokens = 1024 if tiny else 16384  # jax: per training row (think_history), then "truncated"
    # jax with the static engine: KV-cache slots kept per dialogue between turns, the most a session can need
    # (a turn beyond it is encoded afresh); 0 re-encodes the history every turn
    c.cache_slots = session_slots(c.max_total_tokens, c.max_new_tokens) if tiny else 0
    # a think-mode reply without </think>: "continue" lets the simulated user judge the raw text
    # (as an API model's output would be); "end" would freeze the emotion at its last value
    c.format_failure = "continue"
    # think mode: "drop" the policy's earlier thoughts from its context, as the reference and as
    # the conversation an endpoint policy would be sent; "keep" them
    c.think_history = "drop"
    return c


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    preset = arg or "sage"
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; use one of {PRESETS} (e.g. configs/eval.py:tiny)")
    tiny = preset == "tiny"
    smol = preset == "smol"
    cpu = tiny or smol
    c = ml_collections.ConfigDict()
    c.workdir = ""  # required: sentient.json, transcripts.jsonl, report.md and plots go here
    c.seed = 0  # sampling key of a JAX policy; the init of a fresh tiny policy
    # persistent XLA compilation cache: "auto" = $JAX_COMPILATION_CACHE_DIR, else
    # ~/.cache/rlver_jax/jax (shared with training runs); "" = off
    c.compilation_cache_dir = "auto"

    c.eval = ml_collections.ConfigDict()
    # JSONL profiles with first_talk (SAGE: ../shared/data/rlver/test_profile.jsonl); tiny: our own;
    # smol: our English ones only (an English model), of which it plays the held-out ones (eval.holdout)
    c.eval.profiles = str(ENGLISH_PROFILES) if smol else str(SHIPPED_PROFILES) if tiny else ""
    # only the last N profiles of the file, those a training run on it with data.eval_holdout=N held out
    # (0 = all; tiny 4 and smol 16, as their training presets)
    c.eval.holdout = SMOL_HOLDOUT if smol else TINY_HOLDOUT if tiny else 0
    c.eval.max_profiles = 0  # 0 = every profile (of the holdout); else the first N
    # dialogues in flight at once (simulator.max_concurrency bounds the simulator's requests); an
    # openai policy also has at most this many requests in flight
    c.eval.max_dialogues = 16 if cpu else 64
    # dialogues per policy call, which advance in lockstep; max_dialogues equal to it makes a JAX policy's run
    # reproducible (docs/evaluation.md)
    c.eval.group_size = 16 if smol else 8
    # a training run's WORKDIR whose settings (simulator but for its endpoint, sampling, turn and dialogue
    # lengths, think mode) replace SAGE's; "" = off (docs/cli.md)
    c.eval.like_training = ""
    # robustness probes, canned policies a sound simulator must not reward, played beside the policy and
    # scored in the report: comma-separated names, "all", or "" = none
    c.eval.probes = "all" if cpu else ""
    # a panel of simulators, each playing every profile: comma-separated MODEL@URL (served), BACKEND,
    # BACKEND:MODEL or BACKEND:MODEL@URL; "" = config.simulator alone (docs/evaluation.md)
    c.eval.simulators = ""

    c.policy = ml_collections.ConfigDict()
    # "jax": the policy in this process on JAX (a checkpoint, a Hugging Face directory or a fresh tiny model);
    # "openai": a chat endpoint
    c.policy.backend = "jax"
    c.policy.checkpoint = ""  # jax: a training WORKDIR (latest step) or WORKDIR/checkpoints/STEP
    # jax: a Hugging Face Qwen2/Llama directory instead of a checkpoint (smol: the fetched SmolLM2)
    c.policy.path = str(smollm2.DEFAULT_DIR) if smol else ""
    c.policy.fresh_tiny = tiny  # jax with neither checkpoint nor path: a randomly initialised tiny model
    c.policy.dtype = "float32" if cpu else "bfloat16"  # jax with policy.path (a run keeps its own)
    # jax with policy.path: compile one decoder layer and scan it, not every layer (a run keeps its own;
    # smol: docs/benchmarks.md)
    c.policy.scan_layers = smol
    # jax: the rollout engine, as training's config.rollout.engine: "continuous" (continuous batching) or
    # "static" (calls of the dialogues then waiting)
    c.policy.engine = "continuous"
    c.policy.engine_rows = 0  # continuous engine: KV rows (dialogues held at once); 0 = as many as are in flight
    c.policy.decode_chunk = 8  # continuous engine: decode steps between turns entering and replies leaving
    c.policy.prefill_chunk = 256  # continuous engine: most prompt tokens a row writes per prefill call
    c.policy.base_path = ""  # jax: HF dir for the run's architecture and tokenizer if its model.path moved
    # think-then-say; None = the run's own setting for a checkpoint, else no-think
    c.policy.think = config_dict.placeholder(bool)
    # the policy's system message; "" = the project's training prompt (SAGE's, to compare with published
    # scores: docs/evaluation.md)
    c.policy.system_prompt = ""
    c.policy.system_prompt_file = ""  # or a file holding it
    c.policy.update(get_policy_sampling_config(tiny=cpu))
    c.policy.base_url = "http://127.0.0.1:8000/v1"  # openai
    c.policy.model = "policy"  # openai: the served model name
    c.policy.api_key_env = "POLICY_API_KEY"  # openai: env var holding the key; unset for local servers
    c.policy.timeout_s = 300.0  # openai: a request unanswered this long waits on while the server answers
    c.policy.max_retries = 5  # openai: on HTTP 408/409 and 5xx other than 502/503/504 (down: waited for 30 min)
    c.policy.backoff_initial_s = 1.0  # openai: first retry waits about this long, doubling each time
    c.policy.backoff_max_s = 30.0  # openai: cap of one wait

    c.mesh = get_mesh_config(  # sampling: heads split, no gathers
        shape=(1, 1, -1),  # (data, fsdp, tensor) devices; one entry may be -1: the remaining devices
        rules="tensor")  # fsdp | tensor | fsdp_tensor (sharding's presets), or (logical axis, mesh axes) pairs
    c.simulator = get_simulator_config(eval_mode=True)
    if cpu:
        c.simulator.backend = "embedded"
    return c

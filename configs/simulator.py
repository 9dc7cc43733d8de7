"""The `config.simulator` section: the simulated user, its backend and its emotion rules.

Training and evaluation configs include it as `config.simulator = get_simulator_config(...)`.
Defaults are RLVER training values; `eval_mode=True` gives the SAGE benchmark values.

Standalone, for launch/chat_with_simulator.py:
  --config=configs/simulator.py          (training rules)
  --config=configs/simulator.py:eval     (SAGE rules)
"""

import ml_collections


def get_simulator_config(*, eval_mode: bool = False) -> ml_collections.ConfigDict:
    """RLVER training settings, or SAGE benchmark settings when `eval_mode`."""
    c = ml_collections.ConfigDict()
    # who plays the user: "openai", an LLM behind an OpenAI-compatible API, or "embedded", rules on the CPU
    c.backend = "openai"
    c.base_url = "http://127.0.0.1:30000/v1"  # launch/serve_simulator.sh prints this
    c.model = "simulator"  # served model name (serve_simulator.sh serves under this name)
    c.api_key_env = "SIMULATOR_API_KEY"  # env var holding the key; unset is fine for local servers
    c.temperature = 0.5  # simulator sampling temperature of the reference code
    # tokens per simulator answer, 4x a verbose Chinese emotion step (docs/fidelity.md); more for a reasoning
    # simulator that returns its thinking in the answer
    c.max_tokens = 2048
    c.timeout_s = 120.0  # a request unanswered this long waits on while the server answers (slow is not down)
    c.max_concurrency = 64  # requests in flight at once, shared by all dialogues
    # seconds a served simulator takes per request, for launch/plan.py's step estimate (a run times its own):
    # Qwen2.5-72B-Instruct's on 4 A100s under vLLM (docs/sharding.md)
    c.latency_s = 15.0
    c.max_retries = 6  # retries on HTTP 408/409 and 5xx other than 502/503/504
    c.backoff_initial_s = 1.0  # first retry waits about this long, doubling each time
    c.backoff_max_s = 30.0  # cap of one wait
    # seconds a server that is down or throttling is waited for, after which the run saves and exits 75,
    # to be rerun (docs/faults.md)
    c.outage_budget_s = 1800.0
    c.malformed_retries = 2  # fresh samples after an answer breaks the format; then simulator_error
    c.structured_output = "off"  # "off": text answers; "json_schema": JSON answers under a schema (docs/simulator.md)
    c.max_prompt_tokens = 6144  # estimated prompt tokens per request; older turns are left out to fit
    c.max_utterance_chars = 500  # a simulated user's words are cut here (at a sentence end)
    c.difficulty = "vanilla"  # "vanilla" or "challenging" (harsh user)
    c.language = ""  # "" = each profile's own; "zh" or "en" forces the prompt language
    c.cache_dir = ""  # record/replay directory for simulator answers; "" = off
    c.cache_replay_only = False  # True: answer only from cache_dir, never call the server
    c.update(get_emotion_rules_config(eval_mode=eval_mode))
    return c


def get_emotion_rules_config(*, eval_mode: bool = False) -> ml_collections.ConfigDict:
    """The emotion machine's numbers (rlver_jax.simulator.state.EmotionRules): RLVER training's,
    or SAGE's when `eval_mode` (also the in-loop evaluation's, configs/base.py)."""
    c = ml_collections.ConfigDict()
    c.initial_emotion = 40 if eval_mode else 30  # SAGE 40, RLVER training 30
    c.max_change = 10  # per-turn emotion change clipped to [-this, +this] (SAGE: 10)
    c.ceiling = 100  # emotion cap; reaching it ends the dialogue as a success
    c.floor = 10 if eval_mode else 0  # reaching it ends the dialogue as a failure
    c.floor_inclusive = not eval_mode  # training ends at <= 0; SAGE at < 10
    c.band_a = 70  # bands: S at the ceiling, A >= 70, B >= 40, C >= 10, F below
    c.band_b = 40
    c.band_c = 10
    c.max_turns = 10 if eval_mode else 8  # policy turns: 8 in training, 10 rounds in SAGE
    c.score_final_turn = not eval_mode  # SAGE never judges the 10th reply: 9 updates at most
    return c


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """For config_flags: `configs/simulator.py` (training) or `configs/simulator.py:eval`."""
    if arg not in (None, "", "train", "eval"):
        raise ValueError(f"configs/simulator.py:{arg}: use 'train' or 'eval'")
    return get_simulator_config(eval_mode=arg == "eval")

"""The base training config: every field of a run, with the paper's values for the 7B presets.

The paper configs (ppo_think.py, grpo_think.py, ...) call `base.get_base_config(preset, algo,
think)`. Presets:
  tiny: CPU, random-init tiny Qwen2, the locally built tiny tokenizer, the embedded simulator and
        the project's own profiles; a few minutes.
  smol: CPU, the real SmolLM2-135M-Instruct (a Llama) built offline by `.venv/bin/python launch/fetch_smollm2.py`,
        the embedded simulator and the project's own English profiles; short turns that fit a CPU.
  0.5b: Qwen2.5-0.5B-Instruct from --config.model.path, a served simulator.
  7b:   Qwen2.5-7B-Instruct, the paper's setting (default).
  7b_lora: 7b with LoRA rank 64 on one 80 GB GPU (launch/plan.py: docs/sharding.md, "7B on one GPU").
"""

import ml_collections

from configs.eval import ENGLISH_PROFILES, SHIPPED_PROFILES, SMOL_HOLDOUT, TINY_HOLDOUT, get_policy_sampling_config
from configs.mesh import get_mesh_config
from configs.simulator import get_emotion_rules_config, get_simulator_config
from rlver_jax.models import smollm2
from rlver_jax.rl.algorithms import ALGORITHMS
from rlver_jax.sampling.cache_bound import session_slots

PRESETS = ("tiny", "smol", "0.5b", "7b", "7b_lora")


def _row(kind: type) -> ml_collections.FieldReference:
    """A field whose None means the algorithm's value (its row), settable as `kind` from the command line."""
    return ml_collections.FieldReference(None, field_type=kind)
_MODEL_PRESETS = {"tiny": "tiny", "smol": "smollm2-135m", "0.5b": "qwen2.5-0.5b", "7b": "qwen2.5-7b",
                  "7b_lora": "qwen2.5-7b"}
# Dialogues the 7b_lora preset samples at once: the continuous engine's KV rows (rollout.engine_rows), or a
# static call's (rollout.pipeline_groups = dialogues a step / this): their KV caches are what a single 80 GB
# GPU holds beside the frozen base and the sampling copy (the CUDA compiler for an H100: 49.2 GB with 8 rows).
_LORA_1GPU_DIALOGUES_PER_CALL = 8


def get_base_config(preset: str, algo: str, think: bool) -> ml_collections.ConfigDict:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; use one of {PRESETS} (e.g. configs/grpo_think.py:tiny)")
    tiny = preset == "tiny"
    smol = preset == "smol"
    cpu = tiny or smol  # the CPU presets: embedded simulator, shipped profiles, short dialogues
    one_gpu = preset == "7b_lora"
    seven_b = preset in ("7b", "7b_lora")  # the paper's model and lengths
    grouped = ALGORITHMS.row(algo).grouped  # the algorithm table's row (rlver_jax/rl/algorithms.py)
    c = ml_collections.ConfigDict()
    c.workdir = f"runs/{algo}_{'think' if think else 'nothink'}_{preset}"  # metrics, checkpoints, transcripts
    c.seed = 0  # initialisation, data order and sampling keys: all pure functions of (seed, step)
    # persistent XLA compilation cache, so a rerun does not compile again: "auto" ($JAX_COMPILATION_CACHE_DIR,
    # else ~/.cache/rlver_jax/jax), a directory, or "" (off; docs/cli.md)
    c.compilation_cache_dir = "auto"

    c.model = ml_collections.ConfigDict()
    # architecture: tiny, smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b or qwen2.5-7b
    c.model.preset = _MODEL_PRESETS[preset]
    # Hugging Face directory of the policy (required unless random_init); smol: the fetched SmolLM2
    c.model.path = str(smollm2.DEFAULT_DIR) if smol else ""
    # True: random weights of the preset's architecture and a tokenizer built into WORKDIR/tokenizer, for
    # model.path "" (tiny: no download); False: model.path is required
    c.model.random_init = tiny
    c.model.tokenizer_path = ""  # "" = model.path (or the locally built one of random_init)
    c.model.param_dtype = "float32"  # master weights
    c.model.dtype = "float32" if cpu else "bfloat16"  # compute dtype
    # compile one decoder layer and scan it (smol's first step: 183 s against 269 s unrolled, docs/benchmarks.md;
    # tiny's 2 layers compile fast either way)
    c.model.scan_layers = not tiny
    c.model.remat = "none" if cpu else "full"  # recompute activations in the backward pass
    c.model.attention = "auto"  # auto | xla | blockwise (memory ~ T) | cudnn (GPU) | splash (TPU): docs/attention.md
    # MLP over token chunks of at most this many tokens (0: whole rows); 7B: docs/sharding.md, memory plan
    c.model.mlp_chunk = 0 if cpu else 1024

    # LoRA (rlver_jax/models/lora.py): adapters on a frozen base. rank 0 = full fine-tuning.
    c.lora = ml_collections.ConfigDict()
    # adapter rank; 0 = no adapters (every parameter trains); 7b_lora: 64, whose adapters and AdamW
    # state (1.9 GB a model) fit one 80 GB GPU beside the bf16 base
    c.lora.rank = 64 if one_gpu else 0
    c.lora.alpha = 16.0  # the update is (alpha / rank) * A @ B; PEFT's default alpha/rank pair is 8/8
    c.lora.targets = "q,k,v,o,gate,up,down"  # adapted projections (all linear layers, as QLoRA)
    c.lora.base_dtype = "bfloat16" if seven_b else "float32"  # storage dtype of the frozen base
    # config.optim's learning rates x this with LoRA: adapters want ~10x full fine-tuning's rate
    # (Schulman et al. 2025, "LoRA Without Regret"; verl and the tinker cookbook use the same factor)
    c.lora.lr_multiplier = 10.0
    # whole modules trained beside the adapters at config.optim's rate (PEFT's modules_to_save): "" (adapters
    # alone, what LoRA servers load) or a subset of "embed,norms" (tiny's random tied head needs them:
    # docs/benchmarks.md, LoRA)
    c.lora.modules_to_save = "embed,norms" if tiny else ""

    c.critic = ml_collections.ConfigDict()
    c.critic.path = ""  # PPO critic initialisation; "" = the actor's checkpoint (paper)
    # the value head on top of the actor's copy: "normal" (std model.initializer_range, as transformers
    # initialises the reference's critic head) or "zero" (every first value 0, no noise in the first advantages)
    c.critic.value_head_init = "zero" if cpu else "normal"

    # (data, fsdp, tensor) devices, one entry may be -1 (the remaining devices); rules: fsdp | tensor |
    # fsdp_tensor (sharding.RULE_PRESETS) or (logical axis, mesh axes) pairs. 7B: tensor=4 splits its
    # 28 heads / 4 kv heads, MLP, vocabulary and the residual stream's tokens (the `sequence` rule), so
    # each batch shard holds one dialogue; with train.offload PPO and GRPO fit 16 x 16 GB (docs/sharding.md).
    # 7b_lora: one device.
    c.mesh = get_mesh_config(shape=(1, -1, 4), rules="fsdp_tensor") if preset == "7b" else \
        get_mesh_config(shape=(1, 1, 1), rules="fsdp") if one_gpu else get_mesh_config(shape=(1, -1, 1), rules="fsdp")
    c.simulator = get_simulator_config()
    if cpu:
        c.simulator.backend = "embedded"
        # the CPU presets: 1 in think mode, else 3 (smol 2), so a run takes minutes (docs/training.md)
        c.simulator.max_turns = 1 if think else 2 if smol else 3
    else:
        # 0.5b, 7b, 7b_lora: 100, the parser's bound, so no clip, as the reference's training simulator
        c.simulator.max_change = 100

    c.data = ml_collections.ConfigDict()
    # JSONL of training profiles (required); tiny: the project's own, shipped with the package; smol:
    # the English ones only (SmolLM2 is an English model: it answers Chinese profiles with gibberish)
    c.data.train_profiles = str(ENGLISH_PROFILES) if smol else str(SHIPPED_PROFILES) if tiny else ""
    c.data.eval_profiles = ""  # held-out profiles for in-loop evaluation; "" = hold out from train
    # With eval_profiles "", the last N train profiles, never trained on (smol: 16, two of each hidden goal,
    # the profiles configs/eval.py:smol plays).
    c.data.eval_holdout = TINY_HOLDOUT if tiny else SMOL_HOLDOUT if smol else 0

    c.rollout = ml_collections.ConfigDict()
    c.rollout.think = think  # think-then-say: reason in <think>...</think> before replying
    c.rollout.n = ALGORITHMS.row(algo).default_n  # dialogues per profile (a group, for grouped algorithms)
    # per step (paper: 32), x n dialogues; smol: a CPU step of 8 real-model dialogues
    c.rollout.profiles_per_step = (8 if grouped else 16) if tiny else (2 if grouped else 8) if smol else 32
    # tokens per policy turn; smol: the evaluation's 32 (configs/eval.py), about 24 English words
    c.rollout.max_new_tokens = 48 if tiny else 32 if smol else 5000
    c.rollout.max_total_tokens = 1024 if cpu else 15000  # per training row (prompt 5000 + response 10000)
    # With think_history "drop" a turn's prompt no longer extends what the cache holds (the thoughts are
    # gone), so its row is encoded afresh each turn and a cache only holds memory: off in think mode
    # beyond the CPU presets, and at 0.5B.
    cached = cpu or (seven_b and not think)
    # static engine: KV-cache slots kept per dialogue between turns, the most a session can need (a turn
    # beyond it is encoded afresh); 0 re-encodes the history every turn (docs/sharding.md)
    c.rollout.cache_slots = session_slots(c.rollout.max_total_tokens, c.rollout.max_new_tokens) if cached else 0
    c.rollout.temperature = 1.0  # paper: 1.0
    c.rollout.top_p = 1.0  # paper: 1.0
    c.rollout.top_k = 0  # 0 = off
    c.rollout.max_staleness = 0  # policy versions a batch may lag; 0 = strictly on-policy (paper)
    # with max_staleness >= 2, dialogues in flight move to newer versions turn by turn; False: every turn
    # of a batch by its oldest version (an ablation)
    c.rollout.partial_rollouts = True
    # static engine: concurrent dialogue groups per batch (7b_lora: groups of 8 dialogues)
    c.rollout.pipeline_groups = 1 if cpu else (
        c.rollout.profiles_per_step * c.rollout.n // _LORA_1GPU_DIALOGUES_PER_CALL if one_gpu else 4)
    # the rollout engine, with the same tokens either way: "continuous", continuous batching, or "static", calls
    # of the dialogues then waiting, each decoded until its longest reply stops (docs/training.md)
    c.rollout.engine = "continuous"
    # continuous: KV rows (dialogues held at once); 0 = as many as are in flight; 7b_lora: 8, what one 80 GB GPU
    # holds beside the bf16 base and the sampling copy (docs/sharding.md)
    c.rollout.engine_rows = _LORA_1GPU_DIALOGUES_PER_CALL if one_gpu else 0
    c.rollout.decode_chunk = 8  # continuous: decode steps between turns entering and replies leaving
    c.rollout.prefill_chunk = 256  # continuous: most prompt tokens a row writes per prefill call
    # static engine: seconds a dialogue ready for its next turn waits for others of its group to share its policy
    # call (inf: lockstep rounds), long enough for a round's users answering together (docs/benchmarks.md)
    c.rollout.batch_wait_s = 0.25
    # a think-mode reply without </think>: "continue" shows the raw text to the user (the reference);
    # "end" ends the dialogue with reward 0 (tiny: docs/training.md)
    c.rollout.format_failure = "end" if tiny else "continue"
    # think mode: "drop" earlier thoughts from later turns' context and train each turn as its own
    # row, every row with the dialogue's reward (the reference); "keep" them, one row per dialogue
    c.rollout.think_history = "drop"

    c.rl = ml_collections.ConfigDict()
    # the algorithm, a row of rlver_jax/rl/algorithms.py whose values the fields below left "" or None take
    # (set one to mix recipes)
    c.rl.algo = algo
    c.rl.estimator = ""  # the advantage estimator; "" = the algorithm's
    c.rl.policy_loss = ""  # the policy loss; "" = the algorithm's
    # "final": the paper's final emotion / 100; "per_turn": each turn's emotion change
    c.rl.reward_mode = "final"
    c.rl.gamma = 1.0  # GAE discount over policy tokens
    c.rl.lam = 1.0  # GAE lambda
    c.rl.whiten_advantages = True  # PPO: normalise GAE advantages over the batch's policy tokens
    # GRPO-family: divide by the group's std; None = the algorithm's (True; Dr.GRPO: False)
    c.rl.grpo_normalize_std = _row(bool)
    c.rl.grpo_eps = 1e-6  # GRPO: added to the group's std before dividing
    c.rl.clip_eps_low = 0.2  # PPO ratio clip
    c.rl.clip_eps_high = _row(float)  # None = the algorithm's (0.2; DAPO's clip-higher 0.28)
    c.rl.dual_clip = 0.0  # 0 = off; else c > 1 bounds the loss of negative advantages (ppo loss)
    c.rl.gspo_clip_eps_low = 3e-4  # gspo, gspo_token losses: the sequence ratio's clip (the GSPO paper's)
    c.rl.gspo_clip_eps_high = 4e-4
    c.rl.cispo_clip_eps_high = 5.0  # cispo loss: importance weights truncated at 1 + this (NeMo RL's), no lower bound
    c.rl.value_clip = 0.5  # critic value clip range
    c.rl.entropy_coef = 0.001  # token-mean entropy bonus (the reference's verl default)
    c.rl.kl_coef = 0.0  # paper: no KL; non-zero builds a frozen reference model
    # "" = the algorithm's (reward for REINFORCE++, else loss) | loss | reward (penalty on token rewards)
    c.rl.kl_mode = ""
    c.rl.kl_estimator = "k3"  # the per-token estimate of KL(pi || ref)
    # the policy loss over rows, "" = the algorithm's: token_mean, one mean (DAPO, CISPO, REINFORCE++);
    # seq_mean_token_mean, each row's token mean averaged over rows (the reference's); seq_mean_token_sum_norm,
    # token sums over rollout.max_new_tokens (Dr.GRPO)
    c.rl.loss_agg_mode = ""
    # the critic's loss over rows: token_mean, one mean over all tokens (long rows weigh more);
    # seq_mean_token_mean, each row's token mean averaged over rows (the reference's)
    c.rl.value_loss_agg_mode = "token_mean" if cpu else "seq_mean_token_mean"
    # DAPO's overlong shaping: each policy turn's penalty at its token budget (rollout.max_new_tokens), ramping
    # up over the buffer before it, added to the rewards; None = the algorithm's (DAPO 1.0; else 0 = off)
    c.rl.overlong_penalty = _row(float)
    # tokens before the budget where the penalty ramps; 0 = a fifth of it (DAPO's 4096 of 20480)
    c.rl.overlong_buffer = 0
    # DAPO's dynamic sampling: a group whose rewards are all equal is sampled again from a fresh profile, up to
    # dynamic_sampling_retries times, and one still without signal gets no loss weight; None = the algorithm's
    c.rl.dynamic_sampling = _row(bool)
    c.rl.dynamic_sampling_retries = 2  # rounds of re-sampling per step (each as long as a rollout); 0 = filter only
    # turn-level credit (grouped estimators): + this x each turn's emotion change normalised among the turns at
    # its position in the group's dialogues (MT-GRPO / GiGPO turn groups); 0 = off
    c.rl.turn_credit_weight = 0.0
    # weighting of each policy token's loss by rho = pi_old / pi_sample, for tokens an older actor
    # (rollout.max_staleness) or other arithmetic sampled (docs/training.md, "Off-policy correction")
    c.rl.off_policy_correction = "none"
    c.rl.off_policy_level = "token"  # token | sequence: rho of the whole row (tis, mis)
    # lower end of the band [low, high], 0 <= low <= 1 <= high, read by mis and icepop; None = the mode's (0.5)
    c.rl.off_policy_low = ml_collections.config_dict.placeholder(float)
    # upper end, read by every mode but none; None = the mode's (tis and mis 2, icepop and decoupled 5; inf: no cap)
    c.rl.off_policy_high = ml_collections.config_dict.placeholder(float)
    c.rl.ppo_epochs = 1  # passes over each rollout batch
    # train-batch rows per optimizer step (turn rows in think mode with think_history "drop"): the paper's
    # 32 x n, about one step per turn; 0 = the whole batch, one step per epoch (tiny, smol: short CPU runs)
    c.rl.mini_batch_size = 0 if cpu else 32 * c.rollout.n
    # gradient accumulation unit (memory); 7b_lora: one 15,360-token row at a time fits 80 GB (78.2 GB planned by
    # XLA:CPU, 55.2 by the CUDA compiler for an H100: launch/plan.py --gpu=h100:1)
    c.rl.micro_batch_size = 8 if cpu else 1 if one_gpu else 4
    c.rl.logprob_chunk = 1024  # tokens per row through the LM head at a time: [chunk, vocab] fp32 logits live
    # run the update's model passes on rows packed end to end, each a segment of its own, for fewer rows where
    # many are under half the longest (the same numbers to float rounding; docs/training.md, "Packed training rows")
    c.rl.pack_rows = False

    c.optim = ml_collections.ConfigDict()
    c.optim.actor = ml_collections.ConfigDict(dict(
        # paper: 1e-6; tiny 2e-3 (a random model needs far more); smol 1e-4, where 1e-5 left the reward flat
        # in 20 steps (docs/benchmarks.md)
        lr=2e-3 if tiny else 1e-4 if smol else 1e-6,
        warmup_ratio=0.02,  # paper: 0.02; linear warmup over this fraction of the updates, then constant
        weight_decay=0.01,  # AdamW decoupled weight decay
        grad_clip=1.0,  # global gradient-norm clip
        b1=0.9, b2=0.999, eps=1e-8))  # AdamW moments
    c.optim.critic = ml_collections.ConfigDict(dict(
        lr=2e-3 if tiny else 2e-5 if smol else 5e-6,  # paper: 5e-6
        warmup_ratio=0.05,  # paper: 0.05; linear warmup over this fraction of the updates, then constant
        weight_decay=0.01,  # AdamW decoupled weight decay
        grad_clip=1.0,  # global gradient-norm clip
        b1=0.9, b2=0.999, eps=1e-8))  # AdamW moments

    c.train = ml_collections.ConfigDict()
    c.train.steps = 40 if tiny else 20 if smol else 1000  # rollout batches (paper: 1000)
    c.train.length_multiple = 64 if cpu else 512  # training sequence length bucket
    # what waits in host memory: "none"; "idle", the model not being updated during the other's program (PPO);
    # "state", that, the whole train state between steps and the AdamW states during prepare (docs/sharding.md)
    c.train.offload = "state" if seven_b else "none"
    c.train.eval_every = 10 if cpu else 25  # in-loop Sentient evaluation; 0 = off
    c.train.eval_max_profiles = 0  # 0 = every eval profile
    # The in-loop evaluation runs under SAGE's rules (initial emotion 40, failure below 10, 10
    # rounds, the last reply unjudged) with the benchmark's policy sampling (configs/eval.py), on
    # the training simulator's backend, so eval_score is comparable with launch/eval.py's score.
    c.train.eval_rules = get_emotion_rules_config(eval_mode=True)
    c.train.eval_policy = get_policy_sampling_config(tiny=cpu)
    c.train.transcripts = True  # write every batch's dialogues to WORKDIR/transcripts
    c.train.wandb_project = ""  # Weights & Biases project (pip install -e '.[wandb]'); "" = no W&B logging
    c.train.wandb_mode = "online"  # online: stream to W&B; offline: files in WORKDIR/wandb (`wandb sync` them later)
    # the most a step may multiply a model's parameter norm by, beyond which the run stops as diverged before
    # the step is saved (docs/faults.md); 0 = off
    c.train.max_param_norm_growth = 2.0
    # an alarm when a step's degenerate_rate (replies of noise, loops, the wrong language or nothing) rises this
    # much above the run's lowest so far; 0 = off
    c.train.degenerate_alarm = 0.3
    c.train.degenerate_alarm_action = "warn"  # "warn": log it; "stop": end the run before the step is saved

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.save_every = 10 if cpu else 5  # paper: every 5 steps
    # newest checkpoints kept; smol: 1 (a 135M model's fp32 weights and AdamW moments are 1.4 GB each)
    c.checkpoint.keep = 1 if smol else 3
    c.checkpoint.async_save = True  # write in the background while training goes on
    # resume from the newest checkpoint in WORKDIR/checkpoints; False is refused while WORKDIR holds a run
    # (use a new workdir, or start_over)
    c.checkpoint.resume = True
    c.checkpoint.start_over = False  # True: move the run in WORKDIR aside (to WORKDIR.previous-N) and start at step 0
    # fields a resume may change, comma-separated ("optim.actor.lr,train.steps"; "*": every one that may),
    # logged in WORKDIR/changes.jsonl; the run's identity never changes (docs/faults.md)
    c.checkpoint.allow_changes = ""
    # seconds after SIGTERM (a preemption) or Ctrl-C within which the checkpoint is written, else the previous
    # one is kept; below the cloud's notice (30 s on Google Cloud and Azure: docs/faults.md)
    c.checkpoint.stop_within_s = 20.0
    c.checkpoint.read_attempts = 3  # reads of a checkpoint before it is declared unreadable (a transient error)
    return c


def parse_preset(arg: str | None, default: str = "7b") -> str:
    """The preset from `--config=configs/X.py:PRESET`."""
    return arg or default

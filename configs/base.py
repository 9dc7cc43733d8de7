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
    # Persistent XLA compilation cache, so a resume or a second run does not compile again:
    # "auto" = $JAX_COMPILATION_CACHE_DIR, else ~/.cache/rlver_jax/jax (shared by runs); "" = off.
    # Always off on virtual CPU devices (docs/cli.md).
    c.compilation_cache_dir = "auto"

    c.model = ml_collections.ConfigDict()
    c.model.preset = _MODEL_PRESETS[preset]  # architecture (rlver_jax.models.config.PRESETS)
    # Hugging Face directory of the policy (required unless random_init); smol: the fetched SmolLM2
    c.model.path = str(smollm2.DEFAULT_DIR) if smol else ""
    # With model.path "": random weights of the preset's architecture and a tokenizer built locally
    # into WORKDIR/tokenizer (tiny: CPU minutes, no download); False: model.path is required.
    c.model.random_init = tiny
    c.model.tokenizer_path = ""  # "" = model.path (or the locally built one of random_init)
    c.model.param_dtype = "float32"  # master weights
    c.model.dtype = "float32" if cpu else "bfloat16"  # compute dtype
    # Compile one layer, not 28. smol too: its 30 unrolled layers took 1.5x longer for a first
    # step (269 s vs 183 s wall, docs/benchmarks.md); tiny's 2 layers compile fast either way.
    c.model.scan_layers = not tiny
    c.model.remat = "none" if cpu else "full"  # recompute activations in the backward pass
    c.model.attention = "auto"  # auto | xla | blockwise (memory ~ T) | cudnn (GPU) | splash (TPU): docs/attention.md
    # MLP over token chunks of at most this many tokens (0: whole rows); 7B: docs/sharding.md, memory plan
    c.model.mlp_chunk = 0 if cpu else 1024

    # LoRA (rlver_jax/models/lora.py): adapters on a frozen base. rank 0 = full fine-tuning.
    c.lora = ml_collections.ConfigDict()
    # adapter rank; 0 = no adapters (every parameter trains, as before). 7b_lora: 64, the rank whose
    # adapters and AdamW state (1.9 GB a model) fit one 80 GB GPU beside the bf16 base
    c.lora.rank = 64 if one_gpu else 0
    c.lora.alpha = 16.0  # the update is (alpha / rank) * A @ B; PEFT's default alpha/rank pair is 8/8
    c.lora.targets = "q,k,v,o,gate,up,down"  # adapted projections (all linear layers, as QLoRA)
    c.lora.base_dtype = "bfloat16" if seven_b else "float32"  # storage dtype of the frozen base
    # config.optim's learning rates x this with LoRA: adapters want ~10x full fine-tuning's rate
    # (Schulman et al. 2025, "LoRA Without Regret"; verl and the tinker cookbook use the same factor)
    c.lora.lr_multiplier = 10.0
    # Whole modules trained beside the adapters, at config.optim's rate (PEFT's modules_to_save;
    # LongLoRA's "LoRA+"): a subset of "embed,norms". "" for real models: adapters alone are what
    # LoRA servers load. tiny: its frozen random tied head bounds every logit to about +-1.3, so
    # adapters alone cannot sharpen its distributions (docs/benchmarks.md, LoRA).
    c.lora.modules_to_save = "embed,norms" if tiny else ""

    c.critic = ml_collections.ConfigDict()
    c.critic.path = ""  # PPO critic initialisation; "" = the actor's checkpoint (paper)
    # "normal" (std model.initializer_range): as transformers initialises the reference's critic head;
    # "zero": every first value is 0, no noise in the first advantages (the CPU presets, as before)
    c.critic.value_head_init = "zero" if cpu else "normal"  # the value head on top of the actor's copy

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
        # Short dialogues keep the CPU run to minutes. In think mode a random tiny model must
        # first discover "</think>", and a format failure in any turn zeroes the dialogue's
        # reward: one-turn dialogues give it a learning signal from the start.
        # smol: 2 turns without thinking keep a step to about two minutes on 2 shared cores.
        c.simulator.max_turns = 1 if think else 2 if smol else 3
    else:
        # The reference's training simulator adds the change as written (the emotion capped at 100);
        # +-100 is the parser's bound, so this is no clip. Evaluation (train.eval_rules) keeps SAGE's +-10.
        c.simulator.max_change = 100

    c.data = ml_collections.ConfigDict()
    # JSONL of training profiles (required); tiny: the project's own, shipped with the package; smol:
    # the English ones only (SmolLM2 is an English model: it answers Chinese profiles with gibberish)
    c.data.train_profiles = str(ENGLISH_PROFILES) if smol else str(SHIPPED_PROFILES) if tiny else ""
    c.data.eval_profiles = ""  # held-out profiles for in-loop evaluation; "" = hold out from train
    # with eval_profiles "": the last N train profiles, never trained on. smol: SMOL_HOLDOUT (16), two of each
    # hidden goal, the very profiles configs/eval.py:smol plays (a held-out base-vs-trained comparison)
    c.data.eval_holdout = TINY_HOLDOUT if tiny else SMOL_HOLDOUT if smol else 0

    c.rollout = ml_collections.ConfigDict()
    c.rollout.think = think  # think-then-say: reason in <think>...</think> before replying
    c.rollout.n = ALGORITHMS.row(algo).default_n  # dialogues per profile (a group, for grouped algorithms)
    # per step (paper: 32), x n dialogues; smol: a CPU step of 8 real-model dialogues
    c.rollout.profiles_per_step = (8 if grouped else 16) if tiny else (2 if grouped else 8) if smol else 32
    # tokens per policy turn; smol: the evaluation's 32 (configs/eval.py), about 24 English words
    c.rollout.max_new_tokens = 48 if tiny else 32 if smol else 5000
    c.rollout.max_total_tokens = 1024 if cpu else 15000  # per training row (prompt 5000 + response 10000)
    # static engine: KV-cache slots kept per dialogue between turns, so a turn encodes only its new tokens;
    # 0 re-encodes the history every turn (less memory held between turns). With think_history
    # "drop" a turn's prompt no longer extends what the cache holds (the thoughts are gone), so its
    # row is encoded afresh each turn and a cache only holds memory: off in think mode. On for 7B
    # without thinking (its memory per device, measured with launch/plan.py: docs/sharding.md, "The KV
    # cache between turns"); off at 0.5B.
    # The size: the most a session can need (a full row plus another row's fresh prompt plus the
    # new tokens: rlver_jax.sampling.cache_bound); a turn beyond it is encoded afresh, with a warning.
    cached = cpu or (seven_b and not think)
    c.rollout.cache_slots = session_slots(c.rollout.max_total_tokens, c.rollout.max_new_tokens) if cached else 0
    c.rollout.temperature = 1.0  # paper: 1.0
    c.rollout.top_p = 1.0  # paper: 1.0
    c.rollout.top_k = 0  # 0 = off
    c.rollout.max_staleness = 0  # policy versions a batch may lag; 0 = strictly on-policy (paper)
    # With max_staleness >= 2, dialogues in flight move to newer versions turn by turn (rollout.versions);
    # False: every turn of a batch by its oldest version (an ablation).
    c.rollout.partial_rollouts = True
    # static engine: concurrent dialogue groups per batch; 7b_lora: _LORA_1GPU_DIALOGUES_PER_CALL dialogues a group
    c.rollout.pipeline_groups = 1 if cpu else (
        c.rollout.profiles_per_step * c.rollout.n // _LORA_1GPU_DIALOGUES_PER_CALL if one_gpu else 4)
    # The rollout engine, a row of rlver_jax/engines/table.py. "continuous": continuous batching
    # (each turn enters a KV row between decode chunks, each reply leaves as it stops;
    # engines/continuous.py); "static": calls of the dialogues then waiting, each decoded until its
    # longest reply stops (the comparison: docs/benchmarks.md "Rollout with replies of varied
    # length"). Same tokens either way. A field only another engine reads is refused if given.
    c.rollout.engine = "continuous"
    # continuous: KV rows (dialogues held at once); 0 = as many as are in flight. 7b_lora: 8, what one 80 GB GPU
    # holds beside the bf16 base and the sampling copy (49.2 GB/device for the CUDA compiler, launch/plan.py
    # --gpu=h100:1; 16 rows 67.7, above the 63.7 GB a JAX process takes of an H100 by default; 128, GRPO's
    # every dialogue, 327)
    c.rollout.engine_rows = _LORA_1GPU_DIALOGUES_PER_CALL if one_gpu else 0
    c.rollout.decode_chunk = 8  # continuous: decode steps between turns entering and replies leaving
    c.rollout.prefill_chunk = 256  # continuous: most prompt tokens a row writes per prefill call
    # static engine: seconds a dialogue ready for its next turn waits for others of its group to join the policy
    # call (rollout.ready_batches; each moves on as soon as its user answers); inf: lockstep rounds.
    # 0.25: the users of a round answering together share one call (0.05 split them: +21% rollout
    # time at constant latency, docs/benchmarks.md "Rollout under heavy-tailed latency")
    c.rollout.batch_wait_s = 0.25
    # Think-mode reply without </think>: "continue" shows the raw text to the user (the
    # reference); "end" ends the dialogue with reward 0. The tiny presets end it: a random tiny
    # model rarely closes </think> at first, and ending gives it the format as a clear signal.
    c.rollout.format_failure = "end" if tiny else "continue"
    # Think mode: "drop" earlier thoughts from later turns' context and train each turn as its own
    # row, every row with the dialogue's reward (the reference); "keep" them, one row per dialogue.
    c.rollout.think_history = "drop"

    c.rl = ml_collections.ConfigDict()
    # a row of rlver_jax/rl/algorithms.py. The fields below set to "" or None take the row's value; set one to
    # mix recipes.
    c.rl.algo = algo
    c.rl.estimator = ""  # "" = the algorithm's; a row of ESTIMATORS (rlver_jax/rl/algorithms.py)
    c.rl.policy_loss = ""  # "" = the algorithm's; a row of POLICY_LOSSES (rlver_jax/rl/loss_modes.py)
    # a row of rlver_jax/rollout/rewards.py: final, the paper's (final emotion / 100); per_turn, the emotion changes
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
    c.rl.kl_estimator = "k3"  # the per-token estimate of KL(pi || ref): a row of KL_ESTIMATORS (rl/loss_modes.py)
    # "" = the algorithm's. seq_mean_token_mean: each row's token mean, averaged over rows (what the reference
    # optimises: a token mean per micro-batch of one sequence, averaged over ranks; ppo, grpo, rloo, gspo) |
    # token_mean (DAPO, CISPO, REINFORCE++) | seq_mean_token_sum_norm: token sums over rollout.max_new_tokens (Dr.GRPO)
    c.rl.loss_agg_mode = ""
    # seq_mean_token_mean: the reference's per-row token mean; token_mean: one mean over all tokens
    # (long rows weigh more; the CPU presets, as before)
    c.rl.value_loss_agg_mode = "token_mean" if cpu else "seq_mean_token_mean"  # the critic's loss over rows
    # DAPO's overlong shaping: each policy turn's penalty at its token budget (rollout.max_new_tokens), ramping
    # up over the buffer before it, added to the rewards; None = the algorithm's (DAPO 1.0; else 0 = off)
    c.rl.overlong_penalty = _row(float)
    # tokens before the budget where the penalty ramps; 0 = a fifth of it (DAPO's 4096 of 20480)
    c.rl.overlong_buffer = 0
    # DAPO's dynamic sampling: a group whose rewards are all equal is sampled again (a fresh profile), up to
    # dynamic_sampling_retries times; what stays without signal gets no loss weight (metric filtered_groups).
    # None = the algorithm's (DAPO: on)
    c.rl.dynamic_sampling = _row(bool)
    c.rl.dynamic_sampling_retries = 2  # rounds of re-sampling per step (each as long as a rollout); 0 = filter only
    # Turn-level credit (grouped estimators): + this x each turn's emotion change normalised among the turns at
    # its position in the group's dialogues (MT-GRPO / GiGPO turn groups); 0 = off
    c.rl.turn_credit_weight = 0.0
    # Off-policy correction with ratio rho = pi_old / pi_sample of each policy token (the update's start against
    # the actor version that sampled it: rollout.max_staleness > 0, or the sampler's arithmetic), the PPO clip
    # staying around pi_old (rlver_jax/rl/off_policy.py): none (as before) | tis: loss x min(rho, high) |
    # mis: tokens (rows) with rho outside [low, high] leave the loss mask | icepop: loss x rho inside [low, high],
    # 0 outside | decoupled: AReaL's decoupled PPO, loss x rho, 0 where rho > high. Metrics offpolicy_*
    c.rl.off_policy_correction = "none"
    c.rl.off_policy_level = "token"  # token | sequence: rho of the whole row (tis, mis)
    # The band [low, high]; None = the mode's: tis high 2 (verl); mis [0.5, 2] (verl); icepop [0.5, 5] (IcePop);
    # decoupled high 5 (inf: no cap, AReaL's default); 0 <= low <= 1 <= high.
    c.rl.off_policy_low = ml_collections.config_dict.placeholder(float)  # read by mis and icepop
    c.rl.off_policy_high = ml_collections.config_dict.placeholder(float)  # read by every mode but none
    c.rl.ppo_epochs = 1  # passes over each rollout batch
    # Train-batch rows per optimizer step (turn rows in think mode with think_history "drop"): the paper's
    # 32 x n, about one step per turn; 0 = the whole batch, one step per epoch (tiny, smol: short CPU runs)
    c.rl.mini_batch_size = 0 if cpu else 32 * c.rollout.n
    # gradient accumulation unit (memory); 7b_lora: one 15,360-token row at a time fits 80 GB (78.2 GB planned by
    # XLA:CPU, 55.2 by the CUDA compiler for an H100: launch/plan.py --gpu=h100:1)
    c.rl.micro_batch_size = 8 if cpu else 1 if one_gpu else 4
    c.rl.logprob_chunk = 1024  # tokens per row through the LM head at a time: [chunk, vocab] fp32 logits live
    # Run the update's model passes on the rows packed end to end (each row a segment of its own: attention,
    # positions, log-probs, values and losses per row; rl/packing.py): fewer rows where many are under half the
    # batch's longest (turn rows of short and long replies); the same numbers to float rounding. Off: the CPU
    # presets' rows, mostly their system prompt, never fit two to a row; unmeasured on accelerators (docs/training.md)
    c.rl.pack_rows = False

    c.optim = ml_collections.ConfigDict()
    c.optim.actor = ml_collections.ConfigDict(dict(
        # paper: 1e-6 (a random tiny model needs far more). smol: 1e-4, measured: 20 AdamW updates move
        # each weight by about 20 x lr, and at 1e-5 the reward stayed flat (0.30) and the held-out score
        # did not move; at 1e-4 the reward rose 0.29 -> 0.33 and the score 28.2 -> 63.8 (docs/benchmarks.md)
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
    # What waits in host memory (rlver_jax/rl/offload_modes.py): "none"; "idle": the model not being updated,
    # during the other's program (PPO); "state": that, and the whole train state between steps
    # (rollout, evaluation), the AdamW states during prepare. 7B: "state" fits PPO and GRPO on
    # 16 x 16 GB chips (docs/sharding.md) for ~2 x the state crossing PCIe per step.
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
    # A step may multiply a model's parameter norm by at most this; beyond it the update diverged (a
    # learning rate far too high): the run stops before the step is saved (docs/faults.md). 0 = off.
    c.train.max_param_norm_growth = 2.0
    # Degenerate replies (noise, loops, the wrong language, empty: rlver_jax.text.degeneration): an
    # alarm when a step's degenerate_rate rises this much above the lowest rate of the run so far
    # (the GRPO no-think collapse into garbled text at step 2); 0 = off.
    c.train.degenerate_alarm = 0.3
    c.train.degenerate_alarm_action = "warn"  # "warn": log it; "stop": end the run before the step is saved

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.save_every = 10 if cpu else 5  # paper: every 5 steps
    # newest checkpoints kept; smol: 1 (a 135M model's fp32 weights and AdamW moments are 1.4 GB each)
    c.checkpoint.keep = 1 if smol else 3
    c.checkpoint.async_save = True  # write in the background while training goes on
    # Resume from the newest checkpoint in WORKDIR/checkpoints. False is refused while WORKDIR holds a
    # run (it would mix two runs): use a new workdir, or start_over.
    c.checkpoint.resume = True
    c.checkpoint.start_over = False  # True: move the run in WORKDIR aside (to WORKDIR.previous-N) and start at step 0
    # Fields a resume may change (comma-separated, e.g. "optim.actor.lr,train.steps"; "*": every one that
    # may change), logged in WORKDIR/changes.jsonl. The run's identity (model, algorithm, think mode, dtypes,
    # LoRA, seed, dialogues per step) never changes: a new workdir.
    c.checkpoint.allow_changes = ""
    # After SIGTERM (a preemption) or Ctrl-C: the checkpoint must be written within this many seconds, or the
    # run stops keeping the previous one. Under a cloud preemption notice (30 s on Google Cloud and Azure).
    c.checkpoint.stop_within_s = 20.0
    c.checkpoint.read_attempts = 3  # reads of a checkpoint before it is declared unreadable (a transient error)
    return c


def parse_preset(arg: str | None, default: str = "7b") -> str:
    """The preset from `--config=configs/X.py:PRESET`."""
    return arg or default

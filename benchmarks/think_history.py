r"""What `rollout.think_history="drop"` costs the update against "keep" (issue 14).

  PYTHONPATH=. .venv/bin/python benchmarks/think_history.py                     # tiny and 0.5B
  PYTHONPATH=. .venv/bin/python benchmarks/think_history.py --runs=tiny:8x4 --steps=3
  PYTHONPATH=. .venv/bin/python benchmarks/think_history.py --runs=qwen2.5-0.5b:2x2 --steps=2 \
      --micro_batch_size=1 --remat=full --scan_layers --optimizer=sgd      # 0.5B in ~6 GB

For each run (preset:DIALOGUESxTURNS) the same think-mode dialogues are assembled both ways by
rlver_jax.rollout.history.TokenHistory from the same sampled turns: each policy turn is
`<think>` + --think_words words + `</think>` + --reply_words words, each user turn --user_words
words (random words from a small list, tokenised by the tiny tokenizer; ids valid for every
preset's vocabulary). "keep": one row per dialogue, every turn's thinking stays in the context.
"drop": one row per turn, its prompt the reply-only history. Both are collated as training does
(rlver_jax.rl.batch.collate: rows padded to a multiple of the dialogues, length to a multiple
of --length_multiple) and updated by the jitted train step of training (rl_program.make_update_program:
old log-probs, GRPO advantages, one mini-batch of all dialogues, micro-batches of
--micro_batch_size rows, AdamW (or --optimizer=sgd); groups of 2 dialogues, the paper's loss
settings). One warm-up
step (compiles) precedes --steps timed steps; the median is reported, with the tokens the
update reads (real and padded) and the policy tokens it trains on (the same both ways).
"""

import gc
import os
import pathlib
import random
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

import jax  # noqa: E402
import optax  # noqa: E402
from absl import app, flags  # noqa: E402

from rlver_jax.engines.seam import PolicyTurn  # noqa: E402
from rlver_jax.models import qwen2  # noqa: E402
from rlver_jax.models.config import get_preset  # noqa: E402
from rlver_jax.rl import program as rl_program  # noqa: E402
from rlver_jax.rl import train_state
from rlver_jax.rl.batch import collate  # noqa: E402
from rlver_jax.rl.optimizer import Optimizer, make_optimizer  # noqa: E402
from rlver_jax.rl.settings import OptimSettings, RLSettings  # noqa: E402
from rlver_jax.rollout.history import TokenHistory  # noqa: E402
from rlver_jax.rollout.prompts import system_prompt  # noqa: E402
from rlver_jax.rollout.sequence import DialogueSequence  # noqa: E402
from rlver_jax.text import chat  # noqa: E402
from rlver_jax.text.tiny_tokenizer import build_tiny_tokenizer  # noqa: E402

_RUNS = flags.DEFINE_list("runs", ["tiny:8x4", "qwen2.5-0.5b:2x2"], "preset:DIALOGUESxTURNS per run.")
_STEPS = flags.DEFINE_integer("steps", 2, "Timed steps per side (the median is reported).")
_USER = flags.DEFINE_integer("user_words", 16, "Words per user turn.")
_THINK = flags.DEFINE_integer("think_words", 64, "Words of thinking per policy turn.")
_REPLY = flags.DEFINE_integer("reply_words", 16, "Words of reply per policy turn.")
_MICRO = flags.DEFINE_integer("micro_batch_size", 4, "Rows per micro-batch.")
_LENGTH = flags.DEFINE_integer("length_multiple", 64, "Training sequence length bucket.")
_REMAT = flags.DEFINE_enum("remat", "none", ["none", "dots", "full"], "Decoder-layer remat.")
_SCAN = flags.DEFINE_bool("scan_layers", False, "Scanned decoder layers.")
_SIDES = flags.DEFINE_list("sides", ["keep", "drop"], "think_history settings to measure, in this order.")
_OPTIMIZER = flags.DEFINE_enum("optimizer", "adamw", ["adamw", "sgd"],
                               "sgd: no optimizer state (4 GB less at 0.5B in fp32, for a small host).")

_WORDS = ("i", "you", "feel", "tired", "work", "friend", "really", "sorry", "that", "sounds", "hard", "what",
          "happened", "today", "tell", "me", "more", "about", "it", "maybe", "listen", "gently", "ask", "why")


def dialogues(chat_tokens: chat.ChatTokens, n: int, turns: int, drop: bool) -> list[DialogueSequence]:
    """`n` dialogues of `turns` turns, the same texts for a given seed whatever `drop`."""
    rng = random.Random(0)
    words = lambda k: " ".join(rng.choice(_WORDS) for _ in range(k))  # noqa: E731
    out = []
    for d in range(n):
        h = TokenHistory(chat_tokens, max_new_tokens=100_000, max_total_tokens=1_000_000, drop_thoughts=drop)
        h.add_system(system_prompt("en", think=True))
        for _ in range(turns):
            h.add_user(words(_USER.value))
            reply = words(_REPLY.value)
            text = f"<think>{words(_THINK.value)}</think>{reply}"
            ids = chat._text_ids(chat_tokens.tokenizer, text) + [chat_tokens.im_end]
            h.add_turn(PolicyTurn(text=text, token_ids=ids, logprobs=[-1.0] * len(ids)), reply)
        out.append(DialogueSequence(
            profile_id=f"p{d}", group=d // 2, tokens=h.tokens, policy_mask=h.policy_mask, logprobs=h.logprobs,
            turn_ends=h.turn_ends, row_starts=h.row_starts, emotions=[30.0, 30.0 + 10 * (d % 3)],
            end_reason="turn_limit"))
    return out


def median_update_seconds(program, state, batch) -> tuple[float, float]:
    """Median seconds of a train step after one warm-up step, and the load average after."""
    times = []
    for i in range(_STEPS.value + 1):
        t0 = time.perf_counter()
        state, _, _ = rl_program.train_on_batch(program, state, batch)  # fetches the metrics: the step is done
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), os.getloadavg()[0]


def bench(chat_tokens: chat.ChatTokens, spec: str) -> list[str]:
    match = re.fullmatch(r"([\w.-]+):(\d+)x(\d+)", spec)
    if not match:
        raise app.UsageError(f"--runs entry {spec!r}: write PRESET:DIALOGUESxTURNS, e.g. tiny:8x4")
    preset, n, turns = match[1], int(match[2]), int(match[3])
    cfg = get_preset(preset, remat=_REMAT.value, scan_layers=_SCAN.value)
    rows = []
    for mode in _SIDES.value:
        seqs = dialogues(chat_tokens, n, turns, drop=mode == "drop")
        batch = collate(seqs, batch_size=n, length_multiple=_LENGTH.value)
        rl = RLSettings(algo="grpo", mini_batch_size=n, micro_batch_size=min(_MICRO.value, n), batch_size=n,
                                entropy_coef=0.001, loss_agg_mode="seq_mean_token_mean")
        opt = (make_optimizer(OptimSettings(), total_steps=100) if _OPTIMIZER.value == "adamw"
               else Optimizer(optax.sgd(1.0), optax.constant_schedule(1e-6)))
        state = train_state.init_train_state(qwen2.init_params(cfg, jax.random.key(0)), opt.tx, seed=0)
        program = rl_program.make_update_program(rl, cfg, None, opt, None)
        seconds, load = median_update_seconds(program, state, batch)
        b, t = batch.tokens.shape
        real, policy = int(batch.attention_mask.sum()), int(batch.policy_mask.sum())
        rows.append(f"| {preset} | {n} x {turns} | {mode} | {b} x {t} | {real:,} | {b * t:,} | {policy:,} | "
                    f"{seconds:.2f} | {load:.1f} |")
        print(rows[-1], flush=True)
        del state, program, batch, seqs
        gc.collect()  # the next side starts from the memory this one took (0.5B: ~7 GB)
        jax.clear_caches()
    return rows


def main(argv):
    del argv
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; per turn: {_USER.value} user words, "
          f"{_THINK.value} thinking words, {_REPLY.value} reply words; micro-batch {_MICRO.value} rows; "
          f"remat={_REMAT.value}, scan_layers={_SCAN.value}, {_OPTIMIZER.value}")
    with tempfile.TemporaryDirectory() as tmp:
        chat_tokens = chat.ChatTokens.from_tokenizer(chat.load_tokenizer(build_tiny_tokenizer(pathlib.Path(tmp))))
    table = [r for spec in _RUNS.value for r in bench(chat_tokens, spec)]
    print("\n| model | dialogues x turns | think_history | rows x T | tokens | padded tokens | policy tokens "
          "| s / update | load |\n|---|---|---|---|---:|---:|---:|---:|---:|")
    print("\n".join(table))


if __name__ == "__main__":
    app.run(main)

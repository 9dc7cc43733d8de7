r"""Train-step benchmark (issue 7): our jitted policy update vs a PyTorch step of transformers' Qwen2 / Llama.

  .venv/bin/python benchmarks/train_step.py                               # tiny and 0.5B
  .venv/bin/python benchmarks/train_step.py --runs=tiny:16x512 --steps=3  # seconds
  .venv/bin/python benchmarks/train_step.py --runs=smol:8x256 --scan_layers  # the real SmolLM2 (issue 25)
  .venv/bin/python benchmarks/train_step.py --runs=smol:16x1024 --scan_layers --length_spread=0.8 --notorch
  .venv/bin/python benchmarks/train_step.py --dtype=bfloat16 --peak_tflops=989 \
      --runs=qwen2.5-0.5b:8x2048,qwen2.5-1.5b:8x2048                     # an H200 (torch on CUDA)

For each run (preset:BATCHxTOKENS), random weights are drawn once (our init), written as a
Hugging Face directory and loaded by transformers, so both sides train the same model on the same
batch; the preset `smol` is the real SmolLM2-135M-Instruct of `.venv/bin/python launch/fetch_smollm2.py`
(rlver_jax.models.smollm2.DEFAULT_DIR), its directory read by both sides: B rows of T random tokens,
every row full length, alternating 64-token user and policy segments (the policy mask covers half
the tokens), a GRPO reward on each row's last policy token. --length_spread s > 0: rows of lognormal
lengths instead (median a quarter of T, sigma s, capped at T: turn rows of mixed lengths), right-padded.

  ours: exactly what training runs per mini-batch: the actor's program of a train step
    (`make_update_program(...).actor`, `update.model_epochs` over `actor_update`), its params and
    AdamW state donated, with GRPO settings (no critic, no reference), the whole batch one
    mini-batch; old log-probs and advantages come from the prepare program once, outside the timing.
    Forward, backward of the PPO loss (plus the entropy metric), global-norm clipping and optax AdamW,
    one jitted program. The LM head runs only at policy tokens (TrainBatch.arrays()["policy_positions"]),
    as in training.
  ours, all tokens: the same program with every token scored, as a plain step would.
  ours, packed (with --length_spread): the same program on the rows packed (config.rl.pack_rows,
    rlver_jax/rl/packing.py), their layouts made on the host once, outside the timing.
  torch: transformers' Qwen2ForCausalLM (LlamaForCausalLM for smol) in train mode: logits -> log_softmax
    -> gather -> the same token-mean PPO clipped loss on the same old log-probs and advantages ->
    backward -> clip_grad_norm_ -> torch.optim.AdamW step.

The two sides run one after the other and each frees its memory before the next (0.5B in fp32 with
AdamW is ~8 GB per side). One warm-up step (ours compiles) precedes --steps timed steps; the
median is reported.

  model FLOPs per step = 6 x P x B x T + 6 x V x D x S + 6 x L x N x H x T (T + 1) x B (rows of their own
    lengths l: the sum over rows of 6 x P x l + 6 x L x N x H x l (l + 1), the padding not counted)
    P: parameters a token meets in the decoder layers (no embedding table, no LM head); the LM
    head (V x D) at the S tokens a side scores (ours: the policy tokens; the other sides: all);
    the last term is causal attention: QK^T and PV, 2 FLOPs per multiply-add, forward plus a
    twice-as-costly backward, over the T (T + 1) / 2 (query, key) pairs a causal row has.
  MFU: a side's model FLOPs / its step seconds / the measured matmul peak (best of 5 4096x4096
    jnp.dot in --dtype, or --peak_tflops). "vs torch" compares step times (what a run waits for).
"""

import dataclasses
import gc
import json
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout
# On a GPU both sides share the device: JAX must not reserve most of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks.measure import matmul_params, matmul_peak  # noqa: E402
from rlver_jax.models import hf_io, qwen2, smollm2  # noqa: E402
from rlver_jax.models.config import Qwen2Config, get_preset  # noqa: E402
from rlver_jax.rl import program as rl_program  # noqa: E402
from rlver_jax.rl import train_state
from rlver_jax.rl.batch import RowTable, TrainBatch  # noqa: E402
from rlver_jax.rl.optimizer import make_optimizer  # noqa: E402
from rlver_jax.rl.settings import OptimSettings, RLSettings  # noqa: E402

_RUNS = flags.DEFINE_list("runs", ["tiny:16x512", "qwen2.5-0.5b:2x512"], "preset:BATCHxTOKENS per run.")
_STEPS = flags.DEFINE_integer("steps", 3, "Timed steps per side (the median is reported).")
_PROFILE = flags.DEFINE_string("profile_dir", "", "Also write a jax.profiler trace of one more step of "
                               "each of our sides to DIR/PRESET-SIDE (open *.trace.json.gz in Perfetto).")
_REMAT = flags.DEFINE_enum("remat", "none", ["none", "dots", "full"], "Our decoder-layer remat.")
_SCAN = flags.DEFINE_bool("scan_layers", False, "Our scanned decoder layers.")
_MICRO = flags.DEFINE_integer("micro_batch_size", 0, "Our micro-batch rows; 0: the whole batch at once.")
_TORCH = flags.DEFINE_bool("torch", True, "Also run the PyTorch step (off: ours only, for profiling).")
_THREADS = flags.DEFINE_integer("torch_threads", 2, "torch.set_num_threads.")
_SEED = flags.DEFINE_integer("seed", 0, "Weights and batch seed.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Matmul compute dtype (weights stay fp32 master copies; torch: autocast).")
_SPREAD = flags.DEFINE_float("length_spread", 0.0, "0: every row full length; s > 0: lognormal row lengths, "
                             "median T / 4, sigma s, capped at T; adds the side `ours, packed`.")
_PEAK = flags.DEFINE_float("peak_tflops", 0.0, "MFU denominator in TFLOP/s (e.g. 989 for an H200 in bf16); "
                           "0: measure a 4096x4096 jnp.dot in --dtype.")

_SEGMENT = 64  # tokens per user / policy segment of the synthetic dialogues
# Presets read from a fetched Hugging Face directory (real weights) instead of drawn.
_FETCHED = {"smol": smollm2.DEFAULT_DIR}
_CLIP_EPS = 0.2


@dataclasses.dataclass
class Result:
    side: str
    step_s: float  # median
    load: float  # 1-minute load average after the timed steps
    scored: int = 0  # tokens the LM head ran on


def step_flops(config: Qwen2Config, batch: int, tokens: int, scored: int, lengths: np.ndarray | None = None) -> float:
    """Model FLOPs of one forward + backward over `batch` rows of `tokens` (or of `lengths` each),
    the LM head at `scored` tokens (formula in the docstring)."""
    head = config.vocab_size * config.hidden_size
    layer_params = matmul_params(config) - head
    lengths = np.full(batch, tokens) if lengths is None else np.asarray(lengths)
    attention = 6 * config.num_layers * config.num_heads * config.head_dim * lengths * (lengths + 1)
    return float(np.sum(6 * layer_params * lengths + attention) + 6 * head * scored)


def row_lengths(batch: int, tokens: int, rng: np.random.Generator) -> np.ndarray:
    """Every row full length, or with --length_spread lognormal lengths (median tokens / 4, at least
    two segments, at most `tokens`)."""
    if not _SPREAD.value:
        return np.full(batch, tokens)
    drawn = tokens / 4 * np.exp(_SPREAD.value * rng.standard_normal(batch))
    return np.clip(np.round(drawn), 2 * _SEGMENT, tokens).astype(int)


def make_batch(config: Qwen2Config, batch: int, tokens: int, rng: np.random.Generator) -> TrainBatch:
    """Rows of alternating user / policy segments (`row_lengths`, right-padded); groups of 2 rows
    for GRPO, a reward on each row's last policy token."""
    shape = (batch, tokens)
    real = np.arange(tokens)[None] < row_lengths(batch, tokens, rng)[:, None]
    policy = ((np.arange(tokens) // _SEGMENT) % 2 == 1)[None] & real
    last_policy = np.array([np.flatnonzero(row)[-1] for row in policy])
    rewards = np.zeros(shape, np.float32)
    rewards[np.arange(batch), last_policy] = rng.uniform(0.0, 1.0, batch)
    return TrainBatch(
        tokens=np.where(real, rng.integers(1, config.vocab_size, shape, dtype=np.int32), 0).astype(np.int32),
        attention_mask=real.astype(np.int32), policy_mask=policy.astype(np.float32),
        rewards=rewards, sample_logprobs=np.zeros(shape, np.float32),
        group=np.arange(batch, dtype=np.int32) // 2, dialogue=np.arange(batch, dtype=np.int32))


def median_step_seconds(step: Callable[[], None]) -> tuple[float, float]:
    """Median seconds of --steps steps after one warm-up step (which compiles ours), and the load."""
    step()
    times = []
    for _ in range(_STEPS.value):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), os.getloadavg()[0]


def our_config(preset: str) -> Qwen2Config:
    """The preset's architecture (a fetched one's from its config.json) with our benchmark settings."""
    overrides = dict(remat=_REMAT.value, scan_layers=_SCAN.value, dtype=_DTYPE.value)
    if preset not in _FETCHED:
        return get_preset(preset, **overrides)
    path = _FETCHED[preset] / "config.json"
    if not path.exists():
        raise app.UsageError(f"{path}: not found{smollm2.missing_hint(_FETCHED[preset])}")
    return hf_io.config_from_hf(json.loads(path.read_text()), str(path), **overrides)


def init_params(preset: str, config: Qwen2Config):
    """The weights every side starts from (the update donates its copy): a fetched preset's, else
    random ones (our init)."""
    if preset in _FETCHED:
        return hf_io.load_pretrained(_FETCHED[preset], scan_layers=config.scan_layers, remat=config.remat,
                                     compute_dtype=config.dtype)[1]
    return qwen2.init_params(config, jax.random.key(_SEED.value))


def run_ours(preset: str, config: Qwen2Config, batch: TrainBatch, score_all: bool, packed: bool = False
             ) -> tuple[Result, dict[str, np.ndarray]]:
    """Our update step (`packed`: on the rows packed); also returns the prepared old log-probs and
    advantages for torch."""
    rows, length = batch.tokens.shape
    arrays = batch.arrays()
    if score_all:  # every index (0 is the pad index: position 0 has no log-prob anyway)
        arrays["policy_positions"] = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length))
    rl = RLSettings(algo="grpo", mini_batch_size=rows, micro_batch_size=_MICRO.value or rows, pack_rows=packed)
    opt = make_optimizer(OptimSettings(), total_steps=100)
    state = train_state.init_train_state(init_params(preset, config), opt.tx, seed=_SEED.value)
    program = rl_program.make_update_program(rl, config, None, opt, None)
    table = RowTable.of(batch)
    if packed:
        arrays.update(program.prepare_layout(table))
    device_batch = {k: jnp.asarray(v) for k, v in arrays.items()}
    frozen = program.frozen(None)
    inputs, minibatch_rows, _, _ = program.prepare(state.models(), frozen, device_batch)
    if packed:
        minibatch_rows = program.packed_order(minibatch_rows, table)
    params, opt_state = state.model("actor")

    def step() -> None:
        nonlocal params, opt_state
        params, opt_state, metrics = program.actor(state.step, params, opt_state, frozen.base(), inputs,
                                                   minibatch_rows)
        jax.block_until_ready(metrics)

    host = {k: np.asarray(inputs[k]) for k in ("old_logprobs", "advantages")}
    scored = rows * length if score_all else int((batch.policy_mask > 0).sum())
    side = "ours, packed" if packed else "ours, all tokens" if score_all else "ours"
    result = Result(side, *median_step_seconds(step), scored)
    if _PROFILE.value:
        name = f"{preset}-{'packed' if packed else 'all-tokens' if score_all else 'policy-tokens'}"
        with jax.profiler.trace(str(pathlib.Path(_PROFILE.value) / name), create_perfetto_trace=True):
            step()
    return result, host


def run_torch(model_dir: pathlib.Path, batch: TrainBatch, prepared: dict[str, np.ndarray]) -> tuple[Result, float]:
    """transformers Qwen2ForCausalLM: forward, PPO loss, backward, clipping, AdamW.

    Also returns max |log-prob difference| to ours' old log-probs on policy tokens at the initial
    weights (the first step's forward): both sides run the same model on the same batch.
    """
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).train()
    opt = OptimSettings()
    optimizer = torch.optim.AdamW(model.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2), eps=opt.eps,
                                  weight_decay=opt.weight_decay)
    ids = torch.from_numpy(batch.tokens.astype(np.int64)).to(device)
    attn = torch.from_numpy(batch.attention_mask.astype(np.int64)).to(device)
    # Targets are tokens 1..T-1 predicted from positions 0..T-2, as in rlver_jax.rl.logprobs.token_logprobs.
    mask = torch.from_numpy(batch.policy_mask[:, 1:]).to(device)
    old_lp = torch.tensor(prepared["old_logprobs"][:, 1:]).to(device)
    adv = torch.tensor(prepared["advantages"][:, 1:]).to(device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=_DTYPE.value == "bfloat16")
    weights = mask / mask.sum().clamp(min=1.0)
    first_logprobs = []

    def step() -> None:
        with autocast:
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        if not first_logprobs:
            first_logprobs.append(lp.detach())
        ratio = torch.exp(lp - old_lp)
        pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - _CLIP_EPS, 1 + _CLIP_EPS))
        loss = (pg * weights).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt.grad_clip)
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()

    result = Result("torch", *median_step_seconds(step), ids.numel())
    parity = float(((first_logprobs[0] - old_lp).abs() * mask).max())
    return result, parity


def free_memory() -> None:
    gc.collect()
    jax.clear_caches()


def parse_run(spec: str) -> tuple[str, int, int]:
    """A --runs entry PRESET:BATCHxTOKENS as (preset, batch, tokens)."""
    match = re.fullmatch(r"([\w.-]+):(\d+)x(\d+)", spec)
    if not match:
        raise app.UsageError(f"--runs entry {spec!r}: write PRESET:BATCHxTOKENS, e.g. qwen2.5-0.5b:2x512")
    if match[1] not in _FETCHED:
        get_preset(match[1])  # an unknown preset fails here, before any measurement
    return match[1], int(match[2]), int(match[3])


def bench(preset: str, batch_size: int, tokens: int) -> tuple[str, Qwen2Config, int, int, list[Result]]:
    """Both sides on one preset and batch shape, one after the other."""
    spec = f"{preset}:{batch_size}x{tokens}"
    config = our_config(preset)
    batch = make_batch(config, batch_size, tokens, np.random.default_rng(_SEED.value))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _FETCHED.get(preset) or hf_io.save_pretrained(config, init_params(preset, config),
                                                                  pathlib.Path(tmp) / preset)
        free_memory()
        for score_all, packed in ((False, False), (True, False)) + (((False, True),) if _SPREAD.value else ()):
            result, prepared = run_ours(preset, config, batch, score_all, packed)
            results.append(result)
            print(f"  {spec} {result.side}: {result.step_s:.3f} s/step, load {result.load:.1f}", flush=True)
            free_memory()
        if _TORCH.value:
            result, parity = run_torch(model_dir, batch, prepared)
            results.append(result)
            print(f"  {spec} torch: {result.step_s:.3f} s/step, load {result.load:.1f}; "
                  f"max |log-prob ours - torch| on policy tokens at the initial weights: {parity:.1e}", flush=True)
            free_memory()
    return preset, config, batch_size, tokens, results


def main(argv):
    del argv
    torch.set_num_threads(_THREADS.value)
    print(f"jax {jax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"transformers {transformers.__version__}, {jax.devices()[0].device_kind}; ours: "
          f"remat={_REMAT.value}, scan_layers={_SCAN.value}, micro_batch_size={_MICRO.value or 'batch'}")
    shapes = [parse_run(spec) for spec in _RUNS.value]
    peaks = [_PEAK.value * 1e12 or matmul_peak(_DTYPE.value, repeats=5)]
    print(f"{_DTYPE.value} matmul peak {peaks[0] / 1e9:.1f} GFLOP/s, load {os.getloadavg()[0]:.1f}", flush=True)
    runs = [bench(*shape) for shape in shapes]
    if not _PEAK.value:
        peaks.append(matmul_peak(_DTYPE.value, repeats=5))  # again after the runs: the load of a shared host drifts
    peak = max(peaks)
    print(f"\n{_DTYPE.value} matmul peak {peak / 1e9:.1f} GFLOP/s (best of: "
          f"{', '.join(f'{p / 1e9:.1f}' for p in peaks)})")
    print("| model | B x T | side | step s | tokens/s | model GFLOP/s | MFU | vs torch | load |\n"
          "|---|---|---|---:|---:|---:|---:|---:|---:|")
    for preset, config, batch_size, tokens, results in runs:
        torch_s = results[-1].step_s if results[-1].side == "torch" else None
        lengths = row_lengths(batch_size, tokens, np.random.default_rng(_SEED.value))  # make_batch's
        for r in results:
            flops = step_flops(config, batch_size, tokens, r.scored, lengths)
            speedup = f"{torch_s / r.step_s:.2f}x" if torch_s else "-"
            print(f"| {preset} | {batch_size} x {tokens} | {r.side} | {r.step_s:.2f} | "
                  f"{lengths.sum() / r.step_s:,.0f} | {flops / r.step_s / 1e9:.1f} "
                  f"| {flops / r.step_s / peak:.1%} "
                  f"| {speedup} | {r.load:.1f} |")


if __name__ == "__main__":
    app.run(main)

"""Decoder configuration (Qwen2 / Qwen2.5 and the Llama family: SmolLM2, Llama 3) and named presets.

Qwen2 is a Llama with q/k/v biases; one config describes both, and `architecture` says which
Hugging Face class a checkpoint is written back as."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from rlver_jax.models.attention import IMPLEMENTATIONS
from rlver_jax.table import Table

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_REMAT = ("none", "full", "dots")
ARCHITECTURES = ("qwen2", "llama")  # Hugging Face model_type: Qwen2ForCausalLM, LlamaForCausalLM


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """transformers' `rope_type: llama3` (Llama 3.1+): long wavelengths divided by `factor`, short
    ones kept, the band between interpolated (rlver_jax.models.qwen2.rope_frequencies)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self):
        if not self.high_freq_factor > self.low_freq_factor > 0 or self.factor <= 0:
            raise ValueError(f"rope_scaling {self}: needs factor > 0 and high_freq_factor > low_freq_factor > 0")


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
    """Architecture plus numerics of a Qwen2 decoder (hashable: usable as a static jit argument)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    tie_word_embeddings: bool
    rope_theta: float = 1_000_000.0
    rope_scaling: Llama3RopeScaling | None = None  # None: plain RoPE
    architecture: str = "qwen2"  # qwen2 | llama: the Hugging Face class an export is written as
    attention_bias: bool = True  # q/k/v projection biases (Qwen2: yes; Llama: its attention_bias)
    o_bias: bool = False  # output projection bias (Llama's attention_bias covers it; Qwen2 has none)
    mlp_bias: bool = False  # gate/up/down biases (Llama's mlp_bias)
    # Per-head width; 0: hidden_size // num_heads. Set where a checkpoint says otherwise (Llama's head_dim).
    head_size: int = 0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    param_dtype: str = "float32"  # storage dtype of the parameters ("master weights")
    dtype: str = "float32"  # compute dtype of matmuls; norms, softmax and logits stay fp32
    remat: str = "none"  # none | full | dots (save only matmul outputs) per decoder layer
    scan_layers: bool = False  # one scanned layer: compile time independent of depth
    value_head: bool = False  # PPO critic: a scalar value head on the final hidden state, and no LM head
    attention: str = "auto"  # cache-free attention: auto | xla | blockwise | cudnn | splash (models/attention.py)
    # The MLP over token chunks of at most this many tokens per row (0: all at once), each chunk
    # recomputed in the backward pass: the [T, intermediate_size] activations live one chunk at a time.
    mlp_chunk: int = 0

    def __post_init__(self):
        if not self.head_size and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.head_size < 0 or self.head_size % 2:
            raise ValueError(f"head_size={self.head_size} must be even (RoPE rotates pairs), or 0")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture={self.architecture!r}; use one of {ARCHITECTURES}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        for field in ("param_dtype", "dtype"):
            if getattr(self, field) not in _DTYPES:
                raise ValueError(f"{field}={getattr(self, field)!r}; use one of {sorted(_DTYPES)}")
        if self.remat not in _REMAT:
            raise ValueError(f"remat={self.remat!r}; use one of {_REMAT}")
        if self.mlp_chunk < 0:
            raise ValueError(f"mlp_chunk={self.mlp_chunk} (config.model.mlp_chunk) must be >= 0 (0: no chunks)")
        if self.attention not in IMPLEMENTATIONS:
            raise ValueError(f"attention={self.attention!r} (config.model.attention); use one of {IMPLEMENTATIONS}")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def untied_lm_head(self) -> bool:
        """Whether the model holds its own LM-head matrix: untied embeddings and not a critic (a
        critic reads no logits, so the 7B critic carries no 545M-parameter vocabulary projection)."""
        return not self.tie_word_embeddings and not self.value_head

    @property
    def jnp_param_dtype(self):
        return _DTYPES[self.param_dtype]

    @property
    def jnp_dtype(self):
        return _DTYPES[self.dtype]

    def replace(self, **changes) -> "Qwen2Config":
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        """Parameter count (without the value head), for FLOP and memory estimates."""
        d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
        qkv = (self.num_heads + 2 * self.num_kv_heads) * h
        attn = d * qkv + self.attention_bias * qkv + self.num_heads * h * d + self.o_bias * d
        layer = attn + 3 * d * f + self.mlp_bias * (2 * f + d) + 2 * d
        head = self.vocab_size * d if self.untied_lm_head else 0
        return self.vocab_size * d + self.num_layers * layer + d + head


# Architecture numbers of the released checkpoints (see docs: rlver-facts.md).
PRESETS: Table[Qwen2Config] = Table("config.model.preset", {
    "qwen2.5-0.5b": Qwen2Config(
        vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
        intermediate_size=4864, tie_word_embeddings=True),
    "qwen2.5-1.5b": Qwen2Config(
        vocab_size=151936, hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
        intermediate_size=8960, tie_word_embeddings=True),
    "qwen2.5-7b": Qwen2Config(
        vocab_size=152064, hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4,
        intermediate_size=18944, tie_word_embeddings=False),
    # CPU tests and the tiny training preset; vocab matches rlver_jax.text.tiny_tokenizer.
    "tiny": Qwen2Config(
        vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
        intermediate_size=128, tie_word_embeddings=True, rope_theta=10_000.0,
        max_position_embeddings=4096),
    # SmolLM2-135M-Instruct (a Llama: no biases, tied embeddings), the real model of the smol presets.
    "smollm2-135m": Qwen2Config(
        vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
        intermediate_size=1536, tie_word_embeddings=True, rope_theta=100_000.0, rms_norm_eps=1e-5,
        max_position_embeddings=8192, architecture="llama", attention_bias=False),
})


def get_preset(name: str, **overrides) -> Qwen2Config:
    """A preset by name, with field overrides (e.g. dtype="bfloat16", scan_layers=True)."""
    return PRESETS.row(name).replace(**overrides)

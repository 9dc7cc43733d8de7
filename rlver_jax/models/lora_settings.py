"""`config.lora`, typed and checked without JAX (rlver_jax.train.spec reads it before JAX is imported):
the adaptable projections and the whole modules LoRA may train; the adapters themselves are
rlver_jax.models.lora."""

from __future__ import annotations

import dataclasses

from rlver_jax import checks
from rlver_jax.table import Table

# target name -> (module, kernel, number of input dims, Hugging Face module name)
TARGETS: Table[tuple[str, str, int, str]] = Table("config.lora.targets", {
    "q": ("attn", "q_kernel", 1, "self_attn.q_proj"),
    "k": ("attn", "k_kernel", 1, "self_attn.k_proj"),
    "v": ("attn", "v_kernel", 1, "self_attn.v_proj"),
    "o": ("attn", "o_kernel", 2, "self_attn.o_proj"),
    "gate": ("mlp", "gate_kernel", 1, "mlp.gate_proj"),
    "up": ("mlp", "up_kernel", 1, "mlp.up_proj"),
    "down": ("mlp", "down_kernel", 1, "mlp.down_proj"),
})
# modules_to_save name -> (our leaf paths, Hugging Face module names for PEFT's adapter_config)
MODULES: Table[tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]] = Table("config.lora.modules_to_save", {
    "embed": ((("embed", "embedding"), ("lm_head",)), ("embed_tokens", "lm_head")),
    "norms": ((("input_norm", "scale"), ("post_attn_norm", "scale"), ("final_norm", "scale")),
              ("input_layernorm", "post_attention_layernorm", "norm")),
})


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """config.lora, typed: rank 0 is full fine-tuning (no adapters)."""

    rank: int = 0
    alpha: float = 16.0
    targets: tuple[str, ...] = tuple(TARGETS)
    base_dtype: str = "float32"
    lr_multiplier: float = 10.0  # the adapters' learning rates are config.optim's x this
    modules_to_save: tuple[str, ...] = ()  # whole modules trained beside the adapters (MODULES)

    def __post_init__(self):
        checks.check_ranges(checks.named(self, "config.lora.", ("rank", "alpha", "lr_multiplier")), lowest={"rank": 0},
                            positive=("alpha", "lr_multiplier"))
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or (self.rank and not self.targets):
            raise ValueError(f"config.lora.targets={self.targets!r}: use a non-empty subset of {TARGETS.words()} "
                             "(comma-separated)")
        unknown = [m for m in self.modules_to_save if m not in MODULES]
        if unknown:
            raise ValueError(f"config.lora.modules_to_save={','.join(self.modules_to_save)!r}: use a subset of "
                             f"{MODULES.words()} (comma-separated), or '' for adapters alone")
        if self.base_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"config.lora.base_dtype={self.base_dtype!r}; use float32 or bfloat16")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_config(cls, c) -> "LoraSettings":
        """From the `config.lora` ConfigDict; targets and modules_to_save as comma-separated strings
        or sequences."""
        def names(v) -> tuple[str, ...]:
            return tuple(t.strip() for t in (v.split(",") if isinstance(v, str) else v) if t.strip())

        return cls(rank=c.rank, alpha=float(c.alpha), targets=names(c.targets), base_dtype=c.base_dtype,
                   lr_multiplier=float(c.lr_multiplier), modules_to_save=names(c.modules_to_save))

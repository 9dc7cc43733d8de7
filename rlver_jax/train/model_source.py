"""Where a run's models come from (`config.model`, `config.critic`), typed without JAX:
rlver_jax.train.spec reads them before JAX is imported; rlver_jax.train.model_loading loads them."""

from __future__ import annotations

import dataclasses
from typing import Any

VALUE_HEAD_INITS = ("zero", "normal")


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where the policy comes from and how it is laid out (`config.model`)."""

    preset: str  # the architecture without a path (rlver_jax.models.config.PRESETS)
    path: str = ""  # a Hugging Face directory; "": random_init
    random_init: bool = False  # with no path: random weights and a tokenizer built locally
    tokenizer_path: str = ""  # "": path's (or the locally built one)
    param_dtype: str = "float32"
    dtype: str = "float32"
    scan_layers: bool = False
    remat: str = "none"
    attention: str = "auto"
    mlp_chunk: int = 0

    def overrides(self) -> dict[str, Any]:
        """The Qwen2Config fields this source sets on top of the architecture."""
        return dict(param_dtype=self.param_dtype, dtype=self.dtype, scan_layers=self.scan_layers, remat=self.remat,
                    attention=self.attention, mlp_chunk=self.mlp_chunk)


@dataclasses.dataclass(frozen=True)
class CriticSource:
    """Where a critic comes from (`config.critic`): a Hugging Face directory, or the actor's weights
    with a fresh value head (`value_head_init`, drawn from `value_head_key(seed)`)."""

    path: str = ""
    value_head_init: str = "zero"
    seed: int = 0

    def __post_init__(self):
        if self.value_head_init not in VALUE_HEAD_INITS:
            raise ValueError(f"config.critic.value_head_init={self.value_head_init!r}; use one of {VALUE_HEAD_INITS}")

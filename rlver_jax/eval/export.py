"""A loaded policy as a Hugging Face directory that transformers (4.45+ and 5.x), vLLM and SGLang load
(launch/export_hf.py)."""

from __future__ import annotations

import json
import os
import pathlib

from rlver_jax.eval.policy_loading import LoadedPolicy
from rlver_jax.files import atomic_directory, atomic_write_text
from rlver_jax.models import hf_io, lora
from rlver_jax.text.tokenizer_files import save_tokenizer


def export_hf(policy: LoadedPolicy, out: str | os.PathLike, dtype: str) -> pathlib.Path:
    """Write config.json, safetensors weights, generation_config.json and the tokenizer files (in
    the layout of Qwen2.5's release, `text.tokenizer_files.save_tokenizer`) to `out`, which must not exist yet.
    Everything is written into a sibling directory first and renamed into place at the end
    (`files.atomic_directory`), so `out` is either absent or complete."""
    out = pathlib.Path(out)
    if out.exists():
        raise FileExistsError(f"--out={out} exists; choose a new directory or remove it first")
    with atomic_directory(out) as stage:
        # Atomic itself: it writes its files beside the (empty) stage and swaps them in.
        hf_io.save_pretrained(policy.model, policy.params, stage, dtype=dtype)
        # Not save_pretrained: transformers 5 writes a tokenizer_config.json that 4.x cannot read.
        save_tokenizer(policy.chat.tokenizer, stage)
        # A chat turn ends at <|im_end|>: generation must stop there, not only at <|endoftext|>.
        ct = policy.chat
        atomic_write_text(stage / "generation_config.json", json.dumps(
            {"eos_token_id": [ct.im_end, ct.end_of_text], "pad_token_id": ct.end_of_text}, indent=2) + "\n")
    return out


def export_peft_adapter(policy: LoadedPolicy, out: str | os.PathLike) -> pathlib.Path:
    """Write a LoRA run's adapters alone in PEFT's format (adapter_model.safetensors,
    adapter_config.json naming the run's base) to `out`, which must not exist yet; atomic as
    `export_hf`."""
    if policy.adapter is None:
        raise ValueError(f"{policy.source} holds no LoRA adapters (its run trained with config.lora.rank=0)")
    out = pathlib.Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; choose a new directory or remove it first")
    a = policy.adapter
    with atomic_directory(out) as stage:
        lora.save_peft_adapter(a.settings, policy.model, a.params, policy.params, stage, a.base_path)
    return out

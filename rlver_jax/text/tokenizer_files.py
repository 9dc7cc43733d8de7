"""Hugging Face tokenizer files: Qwen2's pre-tokenisation split, and a fast tokenizer saved as a
directory in the layout of Qwen2.5's release (rlver_jax.models.hf_io reads and writes checkpoints
with them; the tiny tokenizer is saved by it). No JAX.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from rlver_jax.files import atomic_write_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# Qwen2's pre-tokenisation split: contractions, letter runs with one optional leading
# non-letter, single digits, punctuation runs, newline runs, and other whitespace.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _is_qwen2_pipeline(backend: dict[str, Any]) -> bool:
    """Whether a tokenizer.json holds exactly Qwen2's text pipeline: NFC, Qwen2's split, byte-level
    BPE. Readers that rebuild that pipeline from the class name (transformers 5's Qwen2Tokenizer,
    4.x's slow one) then tokenise as tokenizer.json does."""
    pre = backend.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    model = backend.get("model") or {}
    return (backend.get("normalizer") == {"type": "NFC"} and len(steps) == 2
            and steps[0].get("type") == "Split" and steps[0].get("pattern") == {"Regex": QWEN2_SPLIT}
            and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert")
            and steps[1].get("type") == "ByteLevel" and not steps[1].get("add_prefix_space")
            and not steps[1].get("use_regex")
            and (backend.get("decoder") or {}).get("type") == "ByteLevel"
            and model.get("type") == "BPE" and not model.get("byte_fallback"))


def _extra_special_tokens(tokenizer: PreTrainedTokenizerFast) -> list[str]:
    # transformers 5 keeps the list as extra_special_tokens; 4.x as additional_special_tokens (its
    # extra_special_tokens is a dict of named tokens).
    extra = getattr(tokenizer, "extra_special_tokens", None)
    if not isinstance(extra, (list, tuple)):
        extra = getattr(tokenizer, "additional_special_tokens", None) or []
    return [str(t) for t in extra]


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, path: str | os.PathLike) -> pathlib.Path:
    """Write a fast (tokenizers-backed) tokenizer into directory `path` in the layout of Qwen2.5's
    own release, which transformers 4.45+ and 5.x (and the servers built on either) read alike.

    Files: tokenizer.json; vocab.json + merges.txt (the same BPE, for slow-tokenizer readers);
    tokenizer_config.json with `added_tokens_decoder`, `additional_special_tokens`, the chat
    template, eos/pad tokens and the 4.x fields, and none of transformers 5's own (its
    `TokenizersBackend` class, `extra_special_tokens` as a list), which 4.x cannot read. The class
    is `Qwen2Tokenizer` when tokenizer.json holds Qwen2's exact pipeline, else the generic
    `PreTrainedTokenizerFast`: transformers 5 rebuilds a Qwen2Tokenizer's pipeline from the class
    (NFC and Qwen2's split), so naming another pipeline Qwen2 would change its token ids.
    """
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    spec = json.loads(backend.to_str())
    model = spec["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r}: a {model.get('type')} model, expected byte-level BPE")
    atomic_write_text(path / "tokenizer.json", json.dumps(spec, ensure_ascii=False, indent=2) + "\n")
    vocab = dict(sorted(model["vocab"].items(), key=lambda kv: kv[1]))
    atomic_write_text(path / "vocab.json", json.dumps(vocab, ensure_ascii=False) + "\n")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    atomic_write_text(path / "merges.txt", "".join(f"{m}\n" for m in ["#version: 0.2", *merges]))
    added = {
        str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
        for t in spec["added_tokens"]}
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": _extra_special_tokens(tokenizer),
        "bos_token": tokenizer.bos_token,
        "chat_template": tokenizer.chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": tokenizer.eos_token,
        "errors": "replace",
        "model_max_length": int(tokenizer.model_max_length),
        "pad_token": tokenizer.pad_token,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer" if _is_qwen2_pipeline(spec) else "PreTrainedTokenizerFast",
        "unk_token": tokenizer.unk_token,
    }
    if config["chat_template"] is None:
        del config["chat_template"]
    atomic_write_text(path / "tokenizer_config.json", json.dumps(config, ensure_ascii=False, indent=2) + "\n")
    return path

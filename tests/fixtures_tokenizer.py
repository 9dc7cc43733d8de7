"""Session fixture: the tiny ChatML tokenizer, trained locally once per test session."""

from pathlib import Path

import pytest

from rlver_jax.text.tiny_tokenizer import build_tiny_tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face tokenizer directory built by `build_tiny_tokenizer` (vocab 512)."""
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))

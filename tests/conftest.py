"""Shared pytest set-up: eight virtual CPU devices and paths to the shared reference data."""

import os
import pathlib

# Eight virtual CPU devices so sharding tests run on one machine; must precede the jax import.
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

pytest_plugins = ["tests.fixtures_tokenizer", "tests.fixtures_qwen_tokenizer"]

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data" / "rlver"


@pytest.fixture(scope="session")
def shared_profiles_dir() -> pathlib.Path:
    """The reference RLVER profiles beside the checkout; tests using them skip when absent."""
    if not (SHARED_DATA / "train_profile.jsonl").exists():
        pytest.skip(f"reference profiles not found at {SHARED_DATA}")
    return SHARED_DATA

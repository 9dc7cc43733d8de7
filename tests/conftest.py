"""Shared pytest set-up: eight virtual CPU devices, cheaper XLA compiles, one compilation cache for
the session, and paths to the shared reference data."""

import os
import pathlib
import shutil
import tempfile

# Eight virtual CPU devices so sharding tests run on one machine; must precede the jax import.
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
# LLVM's backend optimisations off: the same HLO (XLA's own passes and buffer assignment run as
# before, so numbers and memory analyses do not change) at about 70% of the compile time; the
# tests' programs are tiny, so compiling them costs far more than running them. Subprocesses
# inherit it, as they inherit the device count.
if "--xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the session, every program in it however fast it compiled:
# the pytest-xdist workers and the launch/ scripts the tests start (their "auto" cache reads
# $JAX_COMPILATION_CACHE_DIR) reuse each other's programs instead of compiling them again (a tiny
# run's programs, built anew by each Run, are the same programs). A size limit makes JAX lock the
# directory around each read and write, so no process reads an entry another is still writing.
# The process that made the directory removes it at the end.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="rlver_jax_test_cache_")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(8 << 30)

import pytest  # noqa: E402

pytest_plugins = ["tests.fixtures_tokenizer", "tests.fixtures_qwen_tokenizer"]

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data" / "rlver"


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


@pytest.fixture(scope="session")
def shared_profiles_dir() -> pathlib.Path:
    """The reference RLVER profiles beside the checkout; tests using them skip when absent."""
    if not (SHARED_DATA / "train_profile.jsonl").exists():
        pytest.skip(f"reference profiles not found at {SHARED_DATA}")
    return SHARED_DATA

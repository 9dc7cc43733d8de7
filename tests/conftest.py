"""Shared pytest set-up: eight virtual CPU devices (which keep the launch/ scripts' persistent
compilation cache off: rlver_jax.cli.program.compilation_cache_dir), cheaper XLA compiles, and
paths to the shared reference data."""

import os
import pathlib

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
# XLA:CPU's older fusion code generator: the same HLO, compiled faster than by the MLIR fusion
# emitters (the suite in a clean-clone .ci/run, Dec 4 2026: 1310-1392 s before it, 1014-1040 s
# after). Numbers agree to rounding: 6 steps of tiny grpo_think sample the same dialogues, their
# metrics differ from the 7th digit. libtpu does not know the flag (rlver_jax.parallel.topology
# keeps it from libtpu).
if "--xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_cpu_use_fusion_emitters=false"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import pytest  # noqa: E402

pytest_plugins = ["tests.fixtures_tokenizer", "tests.fixtures_qwen_tokenizer"]

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data" / "rlver"


# The modules whose tests take minutes (training runs, the real SmolLM2, multi-process runs, the
# planner's compiles), heaviest first, run before all others: with `-n 2` pytest-xdist hands out
# tests in this order (after the xdist_group groups), so the light tests fill in at the end and the
# two workers finish together instead of one of them running a training test alone.
HEAVY_FIRST = ("training_test", "trainer_test", "multihost_training_test", "plan_test", "qwen2_test",
               "sampling_test", "lora_test", "sharding_test", "rollout_test", "real_simulator_test")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: each module keeps its order
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        for item in items:
            _join_group(item)


def _join_group(item) -> None:
    """Give a test marked `xdist_group(NAME)` the node id `ID@NAME`, by which the scheduler sends a
    group to one worker (so a group's module or session fixture, a training run or the SmolLM2
    directory, is built once). pytest-xdist 3.8 sets `item._nodeid` for it, which pytest 9.2's node
    ids no longer read: without this every group was split over both workers."""
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    suffix = "@" + "_".join(names)
    if names and not item.nodeid.endswith(suffix):
        item._id = type(item._id).parse(item.nodeid + suffix)


@pytest.fixture(scope="session")
def shared_profiles_dir() -> pathlib.Path:
    """The reference RLVER profiles beside the checkout; tests using them skip when absent."""
    if not (SHARED_DATA / "train_profile.jsonl").exists():
        pytest.skip(f"reference profiles not found at {SHARED_DATA}")
    return SHARED_DATA

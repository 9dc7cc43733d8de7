"""rlver_jax.simulator's lazy `__init__`: one simulator module imports only what it needs (no openai
client, no httpx, no JAX), and the package's public names still import as before."""

import subprocess
import sys

from tests.conftest import REPO

_CHECK = """
import sys
import rlver_jax.simulator.profiles
heavy = sorted(m for m in ("openai", "httpx", "jax") if m in sys.modules)
assert not heavy, f"importing rlver_jax.simulator.profiles imported {heavy}"
from rlver_jax.simulator import build_simulator, SimulatorSettings
from rlver_jax import simulator
assert simulator.load_profiles is rlver_jax.simulator.profiles.load_profiles
assert simulator.agent.Simulator is simulator.Simulator  # submodules as attributes, as before
assert "jax" not in sys.modules  # the openai backend, still no JAX
assert "openai" not in sys.modules  # the client loads it with its first request (rlver_jax.llm_client)
print("ok")
"""


def test_a_simulator_module_imports_no_openai_client_and_the_package_names_still_work():
    done = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_every_public_name_resolves():
    from rlver_jax import simulator

    assert len(simulator.__all__) == 21
    for name in simulator.__all__:  # a name mapped to the wrong module raises here
        assert getattr(simulator, name) is not None
        assert name in dir(simulator)

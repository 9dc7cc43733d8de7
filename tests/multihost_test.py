"""Two local processes joined by jax.distributed (CPU, gloo) run a sharded forward that gives the
single-process loss.

The test starts this file twice as a script (`python tests/multihost_test.py PROCESS_ID PORT`),
each process with two virtual CPU devices; together they form a (data 1, fsdp 2, tensor 2) mesh
where fsdp spans the two processes. Each process loads only its rows of the batch.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlver_jax.models import qwen2
from rlver_jax.models.config import get_preset
from rlver_jax.parallel import sharding
from rlver_jax.parallel.distributed import DistributedSettings

REPO = pathlib.Path(__file__).resolve().parents[1]
MESH_SHAPE = (1, 2, 2)
ROWS, LENGTH = 8, 12


def global_batch() -> dict[str, np.ndarray]:
    """The same batch in every process (each keeps only its rows)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 512, (ROWS, LENGTH)).astype(np.int32)
    mask = (np.arange(LENGTH)[None, :] >= (np.arange(ROWS) % 3)[:, None]).astype(np.int32)
    return {"input_ids": ids * mask, "attention_mask": mask}


def row_losses(config, params, batch) -> jax.Array:
    """Mean next-token cross-entropy of each row over its real tokens, [B]."""
    logits = qwen2.forward(config, params, batch["input_ids"], batch["attention_mask"])
    logp = jax.nn.log_softmax(logits[:, :-1])
    nll = -jnp.take_along_axis(logp, batch["input_ids"][:, 1:, None], axis=-1)[..., 0]
    mask = batch["attention_mask"][:, 1:].astype(jnp.float32)
    return (nll * mask).sum(-1) / mask.sum(-1)


def worker(process_id: int, port: int) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    started = sharding.maybe_initialize_distributed(DistributedSettings(
        initialize="auto", coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id))
    assert started and jax.process_count() == 2 and jax.device_count() == 4

    config = get_preset("tiny")
    mesh = sharding.make_mesh(MESH_SHAPE)
    params = sharding.init_sharded_params(config, jax.random.key(0), mesh, "fsdp_tensor")
    rows = sharding.host_batch_rows(mesh, ROWS)
    batch = sharding.shard_host_batch(mesh, {k: v[rows] for k, v in global_batch().items()})
    b_sh = sharding.batch_shardings(mesh, global_batch())
    p_sh = sharding.param_shardings(config, mesh, "fsdp_tensor")

    def losses(params, batch):
        per_row = row_losses(config, params, batch)
        return per_row, per_row.mean()

    step = sharding.jit_sharded(losses, (p_sh, b_sh), (b_sh["input_ids"], NamedSharding(mesh, P())))
    per_row, loss = step(params, batch)
    print(json.dumps({
        "process": jax.process_index(), "rows": rows.tolist(), "loss": float(loss),
        "row_losses": multihost_utils.process_allgather(per_row, tiled=True).tolist(),
        "params_split": params["layer_0"]["mlp"]["gate_kernel"].addressable_shards[0].data.shape == (32, 64),
    }), flush=True)
    jax.distributed.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_compute_the_single_process_loss():
    port = _free_port()
    # Backend optimisation level 0: a third of the compile time on CPU, same HLO.
    flags = "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, __file__, str(i), str(port)], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    results = sorted((json.loads(out.strip().splitlines()[-1]) for out, _ in outputs), key=lambda r: r["process"])

    config = get_preset("tiny")
    params = jax.jit(lambda key: qwen2.init_params(config, key))(jax.random.key(0))
    expected = np.asarray(jax.jit(lambda p, b: row_losses(config, p, b))(params, global_batch()))
    assert [r["process"] for r in results] == [0, 1]
    assert results[0]["rows"] == [0, 1, 2, 3] and results[1]["rows"] == [4, 5, 6, 7]
    for r in results:
        assert r["params_split"]
        np.testing.assert_allclose(r["loss"], expected.mean(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(r["row_losses"], expected, rtol=0, atol=1e-5)


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]))

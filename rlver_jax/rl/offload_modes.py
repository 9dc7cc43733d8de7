"""The offload table: per mode of `config.train.offload`, the train state's parts on the devices at
each stage of a step; the others wait in host memory (rlver_jax.rl.offload moves them).

A train step is a program per stage (rlver_jax.rl.program.train_step): `prepare`, the `actor`'s
update, the `critic`'s update; `rest` is between steps (the rollout, the evaluation,
checkpoints). Each program reads only parts its stage has on the devices; the run key and the step
counter never move. No JAX: the config checks read the table before JAX is imported.
"""

from __future__ import annotations

from rlver_jax.table import Table

PARTS = ("actor", "actor_opt", "critic", "critic_opt")  # the TrainState fields that can move
STAGES = ("prepare", "actor", "critic", "rest")
OFFLOAD: Table[dict[str, tuple[str, ...]]] = Table("config.train.offload", {
    # everything on the devices all the time
    "none": {"prepare": ("actor", "actor_opt", "critic", "critic_opt"),
             "actor": ("actor", "actor_opt", "critic", "critic_opt"),
             "critic": ("actor", "actor_opt", "critic", "critic_opt"),
             "rest": ("actor", "actor_opt", "critic", "critic_opt")},
    # the model not being updated in host memory during the other's program
    "idle": {"prepare": ("actor", "actor_opt", "critic", "critic_opt"),
             "actor": ("actor", "actor_opt"),
             "critic": ("critic", "critic_opt"),
             "rest": ("actor", "actor_opt", "critic", "critic_opt")},
    # and the AdamW states during prepare, the whole state between steps
    "state": {"prepare": ("actor", "critic"),
              "actor": ("actor", "actor_opt"),
              "critic": ("critic", "critic_opt"),
              "rest": ()},
})
# The parts each program reads (its arguments): a stage has at least these on the devices.
READS = {"prepare": ("actor", "critic"), "actor": ("actor", "actor_opt"), "critic": ("critic", "critic_opt")}


def moves_nothing(mode: str) -> bool:
    """Whether offload `mode` keeps every part on the devices at every stage (nothing to move)."""
    return all(set(on) == set(PARTS) for on in OFFLOAD.row(mode).values())

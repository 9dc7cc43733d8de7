"""The algorithm table: what each `config.rl.algo` is, as data.

A row says whether the algorithm trains a critic, whether its dialogues come in groups of `n` per
profile (and the default `n`), which advantage estimator (rlver_jax.rl.estimators.ESTIMATORS) and
which policy loss it uses, its default loss aggregation, and whether each dialogue gets one
advantage that a run view can show. Configs, run checks, the trainer and the run view read the row,
never the name: adding an algorithm is its estimator (or loss) plus one row here.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Algorithm:
    critic: bool  # a value model trained beside the policy (its values feed the estimator)
    grouped: bool  # dialogues come in groups of n per profile, compared with each other
    default_n: int  # config.rollout.n by default: the group size (1 when not grouped)
    estimator: str  # a key of rlver_jax.rl.estimators.ESTIMATORS
    policy_loss: str  # the policy-gradient loss: "ppo" (clipped surrogate, rlver_jax.rl.losses)
    loss_agg_mode: str  # config.rl.loss_agg_mode by default (rlver_jax.rl.losses.AGG_MODES)
    dialogue_advantages: bool  # one advantage per dialogue (outcome estimators): transcripts and views show it

    @property
    def min_n(self) -> int:
        """The fewest dialogues per profile the estimator can compare: 2 in a group, else 1."""
        return 2 if self.grouped else 1


ALGORITHMS: dict[str, Algorithm] = {
    # PPO with a critic and GAE (the paper's PPO)
    "ppo": Algorithm(critic=True, grouped=False, default_n=1, estimator="gae", policy_loss="ppo",
                     loss_agg_mode="seq_mean_token_mean", dialogue_advantages=False),
    # GRPO: rewards normalised within each profile's group of n dialogues (the paper's GRPO)
    "grpo": Algorithm(critic=False, grouped=True, default_n=4, estimator="grpo", policy_loss="ppo",
                      loss_agg_mode="seq_mean_token_mean", dialogue_advantages=True),
}


def algorithm(name: str) -> Algorithm:
    """The row of `config.rl.algo=name`; an unknown name is one error listing the known ones."""
    if name not in ALGORITHMS:
        raise ValueError(f"config.rl.algo={name!r}; use one of {tuple(ALGORITHMS)}")
    return ALGORITHMS[name]

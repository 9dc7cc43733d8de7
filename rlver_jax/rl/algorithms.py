"""The algorithm table: what each `config.rl.algo` is, as data; and the estimator table.

A row of ALGORITHMS names the advantage estimator (a row of `ESTIMATORS`: its function and what it
needs, a critic or groups of dialogues), the policy loss (a row of rlver_jax.rl.loss_modes.POLICY_LOSSES),
the default group size `n`, and the defaults of the knobs that make the recipe: loss aggregation,
GRPO's std scaling, the PPO clip's upper bound, the KL mode, DAPO's overlong shaping and dynamic
sampling. Every knob is also a field of `config.rl` of its own: "" (or None) there takes the row's
value (rlver_jax.rl.settings.RLSettings resolves them, in one place), so an ablation mixes them
freely, e.g. `--config.rl.algo=grpo --config.rl.policy_loss=cispo`. Configs, run checks, the
trainer and the run view read the rows, never the names: adding an algorithm is one row here;
adding an estimator is its function (rlver_jax.rl.estimators) plus one row of `ESTIMATORS`.

This module is plain data (no JAX): the config files and checks read it before any JAX import. So
an estimator's row names its function by import path (rlver_jax.rl.function_path.FunctionPath),
imported when the train step first calls it: one row holds the function and what it needs.
"""

from __future__ import annotations

import dataclasses

from rlver_jax.rl.function_path import FunctionPath
from rlver_jax.table import Table


@dataclasses.dataclass(frozen=True)
class Estimator:
    """An advantage estimator: its function, and what it needs and gives, as the config checks,
    the trainer and the run view read it."""

    function: FunctionPath  # (RLSettings, estimators.EstimatorInputs) -> (advantages [B, T], returns [B, T] or None)
    critic: bool  # it reads a value model's values: a critic trains beside the policy
    grouped: bool  # it compares the dialogues of a profile's group: needs n >= 2 per profile
    dialogue_advantages: bool  # one advantage per dialogue (outcome estimators): transcripts and views show it
    summary: str  # the advantage a dialogue gets, in words (the run view's step pages)


ESTIMATORS: Table[Estimator] = Table("config.rl.estimator", {
    "gae": Estimator(FunctionPath("rlver_jax.rl.estimators.gae"), critic=True, grouped=False,
                     dialogue_advantages=False, summary="per token: GAE with the critic's values (not shown)"),
    "grpo": Estimator(FunctionPath("rlver_jax.rl.estimators.grpo"), critic=False, grouped=True,
                      dialogue_advantages=True,
                      summary="(reward - group mean){std} over the group's trained dialogues; 0 when the "
                              "rewards are all equal"),
    "rloo": Estimator(FunctionPath("rlver_jax.rl.estimators.rloo"), critic=False, grouped=True,
                      dialogue_advantages=True,
                      summary="reward - the mean reward of the other trained dialogues of its group "
                              "(leave-one-out)"),
    "reinforce_pp": Estimator(FunctionPath("rlver_jax.rl.estimators.reinforce_pp"), critic=False, grouped=False,
                              dialogue_advantages=True,
                              summary="the return of its tokens (reward, minus the KL penalty in reward mode), "
                                      "whitened over the batch's policy tokens; its mean over the dialogue's tokens"),
    "reinforce_pp_baseline": Estimator(FunctionPath("rlver_jax.rl.estimators.reinforce_pp_baseline"), critic=False,
                                       grouped=True, dialogue_advantages=True,
                                       summary="(reward - group mean), whitened over the batch's policy tokens"),
}, summary=lambda e: e.summary.format(std=" / std"))


@dataclasses.dataclass(frozen=True)
class Algorithm:
    default_n: int  # config.rollout.n by default: the group size (1 when not grouped)
    estimator: str  # a row of ESTIMATORS
    policy_loss: str  # a row of rlver_jax.rl.loss_modes.POLICY_LOSSES
    loss_agg_mode: str  # a row of rlver_jax.rl.loss_modes.AGG_MODES
    normalize_std: bool = True  # GRPO: divide by the group's std (Dr.GRPO: no)
    clip_eps_high: float = 0.2  # the PPO loss's upper ratio clip (DAPO's clip-higher: 0.28)
    kl_mode: str = "loss"  # where a KL term goes when config.rl.kl_coef != 0: loss | reward (REINFORCE++)
    overlong_penalty: float = 0.0  # DAPO's soft overlong penalty at the turn budget; 0 = no shaping
    dynamic_sampling: bool = False  # DAPO: groups whose rewards are all equal carry no signal and are dropped

    @property
    def kind(self) -> Estimator:
        return ESTIMATORS[self.estimator]

    @property
    def critic(self) -> bool:
        """A value model trained beside the policy (its values feed the estimator)."""
        return self.kind.critic

    @property
    def grouped(self) -> bool:
        """Dialogues come in groups of n per profile, compared with each other."""
        return self.kind.grouped

    @property
    def dialogue_advantages(self) -> bool:
        """One advantage per dialogue: transcripts and run views show it."""
        return self.kind.dialogue_advantages

    @property
    def min_n(self) -> int:
        """The fewest dialogues per profile the estimator can compare: 2 in a group, else 1."""
        return min_n(self.estimator)


def min_n(estimator: str) -> int:
    """The fewest dialogues per profile `estimator` can compare: 2 in a group, else 1."""
    return 2 if ESTIMATORS[estimator].grouped else 1


ALGORITHMS: Table[Algorithm] = Table("config.rl.algo", {
    # PPO with a critic and GAE (the paper's PPO)
    "ppo": Algorithm(default_n=1, estimator="gae", policy_loss="ppo", loss_agg_mode="seq_mean_token_mean"),
    # GRPO: rewards normalised within each profile's group of n dialogues (the paper's GRPO)
    "grpo": Algorithm(default_n=4, estimator="grpo", policy_loss="ppo", loss_agg_mode="seq_mean_token_mean"),
    # RLOO: each dialogue against the mean of the other n - 1 of its group (Ahmadian et al. 2024)
    "rloo": Algorithm(default_n=4, estimator="rloo", policy_loss="ppo", loss_agg_mode="seq_mean_token_mean"),
    # REINFORCE++: token returns (the KL penalty in the rewards) whitened over the batch (Hu 2025)
    "reinforce_pp": Algorithm(default_n=1, estimator="reinforce_pp", policy_loss="ppo",
                              loss_agg_mode="token_mean", kl_mode="reward"),
    # REINFORCE++-baseline: the group mean subtracted first, then whitened over the batch
    "reinforce_pp_baseline": Algorithm(default_n=4, estimator="reinforce_pp_baseline", policy_loss="ppo",
                                       loss_agg_mode="token_mean", kl_mode="reward"),
    # Dr.GRPO: GRPO without the std scaling, the loss summed over tokens over a constant (Liu et al. 2025)
    "drgrpo": Algorithm(default_n=4, estimator="grpo", policy_loss="ppo", loss_agg_mode="seq_mean_token_sum_norm",
                        normalize_std=False),
    # DAPO: clip-higher, token-mean loss, overlong shaping, dynamic sampling (Yu et al. 2025)
    "dapo": Algorithm(default_n=4, estimator="grpo", policy_loss="ppo", loss_agg_mode="token_mean",
                      clip_eps_high=0.28, overlong_penalty=1.0, dynamic_sampling=True),
    # GSPO: GRPO's advantages, a sequence-level length-normalised ratio and clip (Zheng et al. 2025)
    "gspo": Algorithm(default_n=4, estimator="grpo", policy_loss="gspo", loss_agg_mode="seq_mean_token_mean"),
    # CISPO: GRPO's advantages, the importance weight clipped and stop-gradient (MiniMax-M1 2025)
    "cispo": Algorithm(default_n=4, estimator="grpo", policy_loss="cispo", loss_agg_mode="token_mean"),
})

"""The tables of the loss's named parts: the policy losses (with the aggregations each admits), the
aggregation modes, the KL estimators and the off-policy corrections (with what each reads).

Each row holds its function and what the config checks read of it (rlver_jax.rl.settings): adding a
policy loss, an aggregation, a KL estimator or a correction is its function plus one row here. This
module imports no JAX (rlver_jax.train.spec reads the checks before JAX is imported), so a row names
its function by import path (rlver_jax.rl.function_path.FunctionPath), imported when the train
step first calls it; the functions are in rlver_jax.rl.policy_losses, rlver_jax.rl.losses and
rlver_jax.rl.off_policy.
"""

import dataclasses

from rlver_jax.rl.function_path import FunctionPath
from rlver_jax.table import Table

# Per-token loss weights of a mini-batch: (mask [B, T], norm_len) -> w [B, T] (losses.loss_weights).
AGG_MODES: Table[FunctionPath] = Table("config.rl.loss_agg_mode", {
    "token_mean": FunctionPath("rlver_jax.rl.losses.token_mean_weights"),
    "seq_mean_token_mean": FunctionPath("rlver_jax.rl.losses.seq_mean_token_mean_weights"),
    "seq_mean_token_sum_norm": FunctionPath("rlver_jax.rl.losses.seq_mean_token_sum_norm_weights"),
}, also=("config.rl.value_loss_agg_mode",))
# GSPO's objective is a mean over sequences of the token mean; other modes change the algorithm.
GSPO_AGG_MODES = ("seq_mean_token_mean",)

# Per-token estimates of KL(pi || ref): (logprobs, ref_logprobs) -> [B, T] (losses.kl_divergence).
KL_ESTIMATORS: Table[FunctionPath] = Table("config.rl.kl_estimator", {
    "k1": FunctionPath("rlver_jax.rl.losses.kl_k1"),
    "k3": FunctionPath("rlver_jax.rl.losses.kl_k3"),
})


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
    """A value of config.rl.policy_loss: its function and what it admits."""

    function: FunctionPath  # (RLSettings, logprobs, old_logprobs, advantages, mask) -> (loss [B, T], metrics)
    agg_modes: tuple[str, ...]  # the config.rl.loss_agg_mode values it admits
    # Its gradient at ratio 1 is the plain policy gradient, -A * grad log pi, aggregated alike: with one
    # update per batch such losses give the same update (rlver_jax.train.ablation says so)
    ratio_one: bool
    dual_clip: bool = False  # it reads config.rl.dual_clip


POLICY_LOSSES: Table[PolicyLoss] = Table("config.rl.policy_loss", {
    "ppo": PolicyLoss(FunctionPath("rlver_jax.rl.policy_losses.ppo"), tuple(AGG_MODES), ratio_one=True,
                      dual_clip=True),
    # The gspo losses' ratio is a sequence's, so a token-level aggregation (which NeMo RL refuses for
    # sequence-level ratios) would weigh a sequence by its length.
    "gspo": PolicyLoss(FunctionPath("rlver_jax.rl.policy_losses.gspo"), GSPO_AGG_MODES, ratio_one=True),
    "gspo_token": PolicyLoss(FunctionPath("rlver_jax.rl.policy_losses.gspo_token"), GSPO_AGG_MODES, ratio_one=True),
    # its truncated weight is 1 at ratio 1 too
    "cispo": PolicyLoss(FunctionPath("rlver_jax.rl.policy_losses.cispo"), tuple(AGG_MODES), ratio_one=True),
})


@dataclasses.dataclass(frozen=True)
class Correction:
    """A mode of config.rl.off_policy_correction: its function and what it reads and does."""

    # (rho [B, T], C_low, C_high) -> (w [B, T], keep [B, T] bool, truncated [B, T] bool); an absent
    # bound comes as -inf or inf (rlver_jax.rl.off_policy.correction)
    function: FunctionPath
    weighs: bool  # a factor w on each token's policy-gradient loss
    masks: bool  # tokens (or rows) out of the loss mask
    levels: tuple[str, ...]  # config.rl.off_policy_level values it admits
    low: float | None  # the default C_low; None: it has no lower bound
    high: float | None  # the default C_high; None: it has no bound at all


CORRECTIONS: Table[Correction] = Table("config.rl.off_policy_correction", {
    "none": Correction(FunctionPath("rlver_jax.rl.off_policy.unchanged"), weighs=False, masks=False,
                       levels=("token",), low=None, high=None),
    # verl's default rollout_is_threshold; the TIS blog's C = 2
    "tis": Correction(FunctionPath("rlver_jax.rl.off_policy.truncated"), weighs=True, masks=False,
                      levels=("token", "sequence"), low=None, high=2.0),
    # verl's default rollout_rs_threshold, and its default lower bound 1 / upper
    "mis": Correction(FunctionPath("rlver_jax.rl.off_policy.rejected"), weighs=False, masks=True,
                      levels=("token", "sequence"), low=0.5, high=2.0),
    # IcePop's band [alpha, beta] = [0.5, 5]
    "icepop": Correction(FunctionPath("rlver_jax.rl.off_policy.banded"), weighs=True, masks=False,
                         levels=("token",), low=0.5, high=5.0),
    # AReaL's cap is off by default there; 5 here, IcePop's top, so that no stale token dominates
    "decoupled": Correction(FunctionPath("rlver_jax.rl.off_policy.banded"), weighs=True, masks=False,
                            levels=("token",), low=None, high=5.0),
})
LEVELS = ("token", "sequence")

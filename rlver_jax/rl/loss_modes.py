"""The names of the policy losses' aggregation modes, of the KL estimators and of the off-policy
corrections (with what each reads), without JAX: what the settings are checked against before JAX
is imported (rlver_jax.rl.settings); rlver_jax.rl.losses and rlver_jax.rl.off_policy implement them."""

import dataclasses

AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
# GSPO's objective is a mean over sequences of the token mean; other modes change the algorithm.
GSPO_AGG_MODES = ("seq_mean_token_mean",)
# The policy losses by name (rlver_jax.rl.update.POLICY_LOSSES calls them) and the aggregation
# modes each admits: the gspo losses' ratio is a sequence's, so a token-level aggregation (which
# NeMo RL refuses for sequence-level ratios) would weigh a sequence by its length.
POLICY_LOSS_AGG_MODES: dict[str, tuple[str, ...]] = {
    "ppo": AGG_MODES, "gspo": GSPO_AGG_MODES, "gspo_token": GSPO_AGG_MODES, "cispo": AGG_MODES}
KL_ESTIMATORS = ("k1", "k3")


@dataclasses.dataclass(frozen=True)
class Correction:
    """What a mode of config.rl.off_policy_correction reads and does."""

    weighs: bool  # a factor w on each token's policy-gradient loss
    masks: bool  # tokens (or rows) out of the loss mask
    levels: tuple[str, ...]  # config.rl.off_policy_level values it admits
    low: float | None  # the default C_low; None: it has no lower bound
    high: float | None  # the default C_high; None: it has no bound at all


CORRECTIONS: dict[str, Correction] = {
    "none": Correction(weighs=False, masks=False, levels=("token",), low=None, high=None),
    # verl's default rollout_is_threshold; the TIS blog's C = 2
    "tis": Correction(weighs=True, masks=False, levels=("token", "sequence"), low=None, high=2.0),
    # verl's default rollout_rs_threshold, and its default lower bound 1 / upper
    "mis": Correction(weighs=False, masks=True, levels=("token", "sequence"), low=0.5, high=2.0),
    # IcePop's band [alpha, beta] = [0.5, 5]
    "icepop": Correction(weighs=True, masks=False, levels=("token",), low=0.5, high=5.0),
    # AReaL's cap is off by default there; 5 here, IcePop's top, so that no stale token dominates
    "decoupled": Correction(weighs=True, masks=False, levels=("token",), low=None, high=5.0),
}
LEVELS = ("token", "sequence")

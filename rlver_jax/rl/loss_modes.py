"""The names of the policy losses' aggregation modes and of the KL estimators, without JAX: what
the settings are checked against before JAX is imported (rlver_jax.rl.settings); rlver_jax.rl.losses
implements each name."""

AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
# GSPO's objective is a mean over sequences of the token mean; other modes change the algorithm.
GSPO_AGG_MODES = ("seq_mean_token_mean",)
# The policy losses by name (rlver_jax.rl.update.POLICY_LOSSES calls them) and the aggregation
# modes each admits: the gspo losses' ratio is a sequence's, so a token-level aggregation (which
# NeMo RL refuses for sequence-level ratios) would weigh a sequence by its length.
POLICY_LOSS_AGG_MODES: dict[str, tuple[str, ...]] = {
    "ppo": AGG_MODES, "gspo": GSPO_AGG_MODES, "gspo_token": GSPO_AGG_MODES, "cispo": AGG_MODES}
KL_ESTIMATORS = ("k1", "k3")

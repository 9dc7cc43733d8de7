"""The typed `config.rl` and `config.optim` sections, without JAX (rlver_jax.rl.optimizer builds the optimizer).

`RLSettings` is hashable (static under jit); its algorithm's row (rlver_jax.rl.algorithms) says
what the update does.
"""

from __future__ import annotations

import dataclasses
import math

from rlver_jax.rl import algorithms, loss_modes
from rlver_jax.rollout import rewards

KL_MODES = ("loss", "reward")


@dataclasses.dataclass(frozen=True)
class RLSettings:
    """The `config.rl` section as a typed, hashable record (static under jit).

    The fields marked "row" take the algorithm's value (its row of rlver_jax.rl.algorithms) when
    given as "" or None; they are resolved here, once, so every reader sees concrete values.
    `max_new_tokens` and `max_turns` come from the rollout and simulator sections
    (rlver_jax.train.spec.rl_settings)."""

    algo: str = "ppo"
    estimator: str = ""  # row; algorithms.ESTIMATORS
    policy_loss: str = ""  # row; loss_modes.POLICY_LOSSES
    loss_agg_mode: str = ""  # row; loss_modes.AGG_MODES
    reward_mode: str = "final"  # a row of rlver_jax.rollout.rewards.REWARDS (the rollouts score by it)
    gamma: float = 1.0
    lam: float = 1.0
    whiten_advantages: bool = True
    grpo_normalize_std: bool | None = None  # row
    grpo_eps: float = 1e-6
    clip_eps_low: float = 0.2
    clip_eps_high: float | None = None  # row
    dual_clip: float = 0.0  # 0 disables; otherwise c > 1 (the ppo loss only)
    gspo_clip_eps_low: float = 3e-4  # the gspo losses' clip range (GSPO's paper)
    gspo_clip_eps_high: float = 4e-4
    cispo_clip_eps_high: float = 5.0  # the cispo loss's truncation: weights <= 1 + this; no lower bound
    value_clip: float = 0.5
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_mode: str = ""  # row
    kl_estimator: str = "k3"
    # DAPO's overlong shaping of each policy turn's length against max_new_tokens: the penalty at the
    # budget (row; 0 = off) and the tokens before it where the penalty ramps up (0 = a fifth of the budget)
    overlong_penalty: float | None = None
    overlong_buffer: int = 0
    dynamic_sampling: bool | None = None  # row; groups whose rewards are all equal get no loss weight
    # with dynamic_sampling: times such a group is sampled again (rl.dynamic_sampling)
    dynamic_sampling_retries: int = 2
    turn_credit_weight: float = 0.0  # turn-level group advantages mixed in with this weight (grouped estimators)
    # The sampling policy's log-probs against the update's: a row of loss_modes.CORRECTIONS, at token or
    # sequence level, with the band [low, high] (None: the mode's default)
    off_policy_correction: str = "none"
    off_policy_level: str = "token"
    off_policy_low: float | None = None
    off_policy_high: float | None = None
    value_loss_agg_mode: str = "token_mean"  # the critic's loss (loss_modes.AGG_MODES)
    ppo_epochs: int = 1
    mini_batch_size: int = 32  # train-batch rows per optimizer step (with batch_size 0)
    micro_batch_size: int = 8
    # Dialogues per train step: mini-batches are then cut in these units (a batch of more rows, one
    # per dialogue turn, gives each mini-batch proportionally more rows). 0: in the batch's rows, and
    # the batch's rows are a multiple of mini_batch_size (the last mini-batch's real rows may be fewer).
    batch_size: int = 0
    logprob_chunk: int = 1024  # tokens per row through the LM head at a time (rl.logprobs)
    # The model passes run on the rows packed end to end (rl.packing): the same numbers to float rounding
    pack_rows: bool = False
    max_new_tokens: int = 512  # config.rollout.max_new_tokens: a policy turn's token budget
    max_turns: int = 8  # config.simulator.max_turns: policy turns per dialogue (turn arrays' static size)

    def __post_init__(self):
        row = algorithms.ALGORITHMS.row(self.algo)
        defaults = {"estimator": row.estimator, "policy_loss": row.policy_loss, "loss_agg_mode": row.loss_agg_mode,
                    "grpo_normalize_std": row.normalize_std, "clip_eps_high": row.clip_eps_high,
                    "kl_mode": row.kl_mode, "overlong_penalty": row.overlong_penalty,
                    "dynamic_sampling": row.dynamic_sampling}
        for name, value in defaults.items():
            if getattr(self, name) in ("", None):
                object.__setattr__(self, name, value)
        for table, name in ((algorithms.ESTIMATORS, "estimator"), (loss_modes.POLICY_LOSSES, "policy_loss"),
                            (loss_modes.KL_ESTIMATORS, "kl_estimator"), (loss_modes.AGG_MODES, "loss_agg_mode"),
                            (loss_modes.AGG_MODES, "value_loss_agg_mode"), (rewards.REWARDS, "reward_mode"),
                            (loss_modes.CORRECTIONS, "off_policy_correction")):
            table.row(getattr(self, name), f"config.rl.{name}")
        for name, words in (("kl_mode", KL_MODES), ("off_policy_level", loss_modes.LEVELS)):
            if getattr(self, name) not in words:
                raise ValueError(f"config.rl.{name}={getattr(self, name)!r}: use one of {' | '.join(words)}")
        correction = self.off_policy_kind
        for name in ("low", "high"):  # the mode's default band
            if getattr(self, f"off_policy_{name}") is None:
                object.__setattr__(self, f"off_policy_{name}", getattr(correction, name))
        if not self.overlong_buffer:
            object.__setattr__(self, "overlong_buffer", max(self.max_new_tokens // 5, 1))
        if self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"config.rl.mini_batch_size={self.mini_batch_size} is not a multiple of "
                f"config.rl.micro_batch_size={self.micro_batch_size}")
        if self.logprob_chunk < 1:
            raise ValueError(f"config.rl.logprob_chunk={self.logprob_chunk} must be >= 1 (tokens per LM-head chunk)")
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ValueError(f"config.rl.dual_clip={self.dual_clip}: use 0 (off) or a value > 1")
        if self.batch_size % self.mini_batch_size:
            raise ValueError(f"{self.batch_size} dialogues per step are not a multiple of "
                             f"config.rl.mini_batch_size={self.mini_batch_size}")
        self._check_combination()

    def _check_combination(self) -> None:
        """One line naming the fields of a combination that is not meaningful."""
        loss = f"config.rl.policy_loss={self.policy_loss!r}"
        if self.loss_agg_mode not in (modes := self.policy_loss_kind.agg_modes):
            raise ValueError(f"{loss} with config.rl.loss_agg_mode={self.loss_agg_mode!r}: its ratio is a sequence's, "
                             f"so its loss is a mean over sequences; use config.rl.loss_agg_mode in {modes}")
        if self.dual_clip and not self.policy_loss_kind.dual_clip:
            bounded = loss_modes.POLICY_LOSSES.where(lambda loss: loss.dual_clip)
            raise ValueError(f"config.rl.dual_clip={self.dual_clip} with {loss}: the dual clip bounds only "
                             f"config.rl.policy_loss in {bounded}; set --config.rl.dual_clip=0")
        kind = self.estimator_kind
        for name, on in (("dynamic_sampling", self.dynamic_sampling), ("turn_credit_weight", self.turn_credit_weight)):
            if on and not kind.grouped:
                raise ValueError(f"config.rl.{name}={getattr(self, name)} with config.rl.estimator={self.estimator!r}: "
                                 "it compares the dialogues of a group; use a grouped estimator "
                                 f"{algorithms.ESTIMATORS.where(lambda e: e.grouped)}")
        if self.overlong_penalty < 0 or (self.overlong_penalty and not 0 < self.overlong_buffer <= self.max_new_tokens):
            raise ValueError(f"config.rl.overlong_penalty={self.overlong_penalty} with config.rl.overlong_buffer="
                             f"{self.overlong_buffer}: need a penalty >= 0 and 0 < buffer <= "
                             f"config.rollout.max_new_tokens={self.max_new_tokens}")
        for name in ("gspo_clip_eps_low", "gspo_clip_eps_high", "cispo_clip_eps_high", "clip_eps_low", "clip_eps_high"):
            if getattr(self, name) < 0:
                raise ValueError(f"config.rl.{name}={getattr(self, name)} must be >= 0")
        self._check_off_policy()
        if self.dynamic_sampling_retries < 0:
            raise ValueError(f"config.rl.dynamic_sampling_retries={self.dynamic_sampling_retries} must be >= 0")
        if self.max_turns < 1 or self.max_new_tokens < 1:
            raise ValueError(f"max_turns={self.max_turns} and max_new_tokens={self.max_new_tokens} must be >= 1")

    def _check_off_policy(self) -> None:
        """One line naming the off_policy_* field a correction does not read, or a band out of order."""
        mode, correction = f"config.rl.off_policy_correction={self.off_policy_correction!r}", self.off_policy_kind
        if self.off_policy_level not in correction.levels:
            raise ValueError(f"config.rl.off_policy_level={self.off_policy_level!r} with {mode}: it is defined at "
                             f"config.rl.off_policy_level in {correction.levels}")
        for name in ("low", "high"):
            if getattr(correction, name) is None and getattr(self, f"off_policy_{name}") is not None:
                raise ValueError(f"config.rl.off_policy_{name}={getattr(self, f'off_policy_{name}')} with {mode}: it "
                                 f"has no {'lower bound' if name == 'low' else 'bound'}; leave it unset")
        low, high = (0.0 if self.off_policy_low is None else self.off_policy_low), self.off_policy_high
        if high is not None and not (0.0 <= low <= 1.0 <= high and low < high):
            raise ValueError(f"config.rl.off_policy_low={self.off_policy_low} and config.rl.off_policy_high={high} "
                             f"with {mode}: need "
                             "0 <= off_policy_low <= 1 <= off_policy_high, low < high (a token the sampler and the "
                             "update agree on, ratio 1, keeps its loss)")

    def minibatches(self, rows: int) -> int:
        """Mini-batches per epoch over a batch of `rows` rows."""
        return (self.batch_size or rows) // self.mini_batch_size

    @property
    def algorithm(self) -> algorithms.Algorithm:
        """The row of the algorithm table for `algo`."""
        return algorithms.ALGORITHMS[self.algo]

    @property
    def off_policy_kind(self) -> loss_modes.Correction:
        """The off-policy correction's row: its function, what it reads and does."""
        return loss_modes.CORRECTIONS[self.off_policy_correction]

    @property
    def estimator_kind(self) -> algorithms.Estimator:
        """The resolved estimator's row: its function, what it needs and gives."""
        return algorithms.ESTIMATORS[self.estimator]

    @property
    def policy_loss_kind(self) -> loss_modes.PolicyLoss:
        """The policy loss's row: its function, the aggregations it admits."""
        return loss_modes.POLICY_LOSSES[self.policy_loss]

    @property
    def min_n(self) -> int:
        """The fewest dialogues per profile the estimator can compare: 2 in a group, else 1."""
        return algorithms.min_n(self.estimator)

    @property
    def uses_critic(self) -> bool:
        return self.estimator_kind.critic

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef != 0.0


@dataclasses.dataclass(frozen=True)
class OptimSettings:
    """AdamW with linear warmup then a constant rate, and global-norm gradient clipping."""

    lr: float = 1e-6
    warmup_ratio: float = 0.02
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self):
        """Range checks, every bad field in one ValueError naming it by its key in config.optim.actor
        or .critic ("lr=-1.0 must be a finite number >= 0"); rlver_jax.train.spec adds the section."""
        bounds = {"lr": (0.0, math.inf, "a finite number >= 0"), "warmup_ratio": (0.0, 1.0, "in [0, 1]"),
                  "weight_decay": (0.0, math.inf, "a finite number >= 0"),
                  "grad_clip": (0.0, math.inf, "a finite number > 0"), "b1": (0.0, 1.0, "in [0, 1)"),
                  "b2": (0.0, 1.0, "in [0, 1)"), "eps": (0.0, math.inf, "a finite number > 0")}
        open_above, open_below = ("b1", "b2"), ("grad_clip", "eps")
        problems = []
        for name, (low, high, what) in bounds.items():
            value = getattr(self, name)
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                  and low <= value <= high and not (name in open_above and value == high)
                  and not (name in open_below and value == low))
            if not ok:
                problems.append(f"{name}={value!r} must be {what}")
        if problems:
            raise ValueError("; ".join(problems))

    def warmup_steps(self, total_steps: int) -> int:
        """The train steps of the linear warmup over a run of `total_steps`: all that the
        optimizer (rlver_jax.rl.optimizer) reads of the run's length."""
        return max(int(self.warmup_ratio * total_steps), 1)

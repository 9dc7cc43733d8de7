"""Plain-numpy, loop-based transcriptions of the reference estimators and losses, for the tests.

Written from the papers and from the formulas of verl's trainer/ppo/core_algos.py (function named
in each docstring), in float64, one row / group / token at a time, independently of
rlver_jax.rl. Where our functions deliberately differ from verl's code the docstring says so, and
the `verl_*` functions transcribe verl's own loop so that the tests can show the two agree where
verl's setting applies.
"""

import numpy as np

WHITEN_EPS = 1e-8


def whiten(x, mask, eps=WHITEN_EPS):
    """verl masked_whiten: (x - mean) / sqrt(var + eps), mean and var (ddof=1) over the selected
    entries; 0 elsewhere."""
    sel = np.asarray(x, np.float64)[mask > 0]
    mean, var = sel.mean(), sel.var(ddof=1)
    out = np.zeros(np.shape(x), np.float64)
    for idx in zip(*np.nonzero(mask > 0)):
        out[idx] = (x[idx] - mean) / np.sqrt(var + eps)
    return out


def rloo(scores, group_ids, members, dialogue_ids):
    """A_i = s_i - mean of the member scores of i's group from other dialogues; 0 with none
    (verl compute_rloo_outcome_advantage for member rows: s_i n/(n-1) - mean_g n/(n-1))."""
    out = np.zeros(len(scores), np.float64)
    for i in range(len(scores)):
        others = [float(scores[j]) for j in range(len(scores))
                  if group_ids[j] == group_ids[i] and members[j]
                  and dialogue_ids[j] != dialogue_ids[i]]
        if others:
            out[i] = float(scores[i]) - sum(others) / len(others)
    return out


def verl_rloo(scores, group_ids):
    """verl's loop for a group of n > 1: s_i * n / (n - 1) - mean_g * n / (n - 1)."""
    out = np.asarray(scores, np.float64).copy()
    for g in np.unique(group_ids):
        idx = np.flatnonzero(group_ids == g)
        n = len(idx)
        if n > 1:
            mean = out[idx].mean()
            out[idx] = out[idx] * n / (n - 1) - mean * n / (n - 1)
    return out


def returns_to_go(rewards, mask, gamma):
    """G over each row's policy tokens only: G[t_k] = r[t_k] + gamma G[t_{k+1}]; 0 elsewhere."""
    out = np.zeros(rewards.shape, np.float64)
    for b in range(rewards.shape[0]):
        running = 0.0
        for t in reversed(np.flatnonzero(mask[b])):
            running = float(rewards[b, t]) + gamma * running
            out[b, t] = running
    return out


def verl_reinforce_pp(rewards, mask, gamma):
    """verl compute_reinforce_plus_plus_outcome_advantage's loop: the running return is reset to 0
    after every token with mask 0. Returns (advantages, returns)."""
    returns = np.zeros(rewards.shape, np.float64)
    running = np.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return whiten(returns, mask) * mask, returns


def group_mean_centered(scores, group_ids, members):
    """s_i - mean of the members of i's group; 0 in a group with fewer than two members."""
    out = np.zeros(len(scores), np.float64)
    for i in range(len(scores)):
        group = [float(scores[j]) for j in range(len(scores))
                 if group_ids[j] == group_ids[i] and members[j]]
        if len(group) > 1:
            out[i] = float(scores[i]) - np.mean(group)
    return out


def reinforce_pp_baseline(scores, group_ids, members, mask):
    """verl compute_reinforce_plus_plus_baseline_outcome_advantage: centre by the group mean,
    tile over the tokens, whiten over the batch's policy tokens (a group of one: 0, where verl
    keeps the raw score)."""
    centered = group_mean_centered(scores, group_ids, members)
    return whiten(centered[:, None] * mask, mask)


def verl_agg_loss(loss, mask, mode, loss_scale_factor=None):
    """verl agg_loss on one device (dp_size 1), our mode names."""
    loss, mask = np.asarray(loss, np.float64), np.asarray(mask, np.float64)
    seq_tokens = mask.sum(-1)
    real_rows = seq_tokens > 0
    if mode == "token_mean":
        return (loss * mask).sum() / mask.sum()
    if mode == "seq_mean_token_mean":
        per_row = (loss * mask).sum(-1) / (seq_tokens + 1e-8)
        return per_row[real_rows].sum() / real_rows.sum()
    if mode == "seq_mean_token_sum_norm":
        per_row = (loss * mask).sum(-1)
        scale = mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        return per_row[real_rows].sum() / real_rows.sum() / scale
    raise ValueError(mode)


def overlong_penalty(length, max_tokens, buffer_len, factor):
    """DAPO Eq. 13 (times the factor), written piecewise."""
    if length <= max_tokens - buffer_len:
        return 0.0
    if length <= max_tokens:
        return factor * ((max_tokens - buffer_len) - length) / buffer_len
    return -factor


def degenerate_groups(scores, group_ids, members, num_groups):
    """True where the group's member scores hold fewer than two distinct values."""
    return np.array([len({float(scores[i]) for i in range(len(scores))
                          if group_ids[i] == g and members[i]}) < 2
                     for g in range(num_groups)])


def turn_group(turn_rewards, turn_valid, group_ids, members, normalize_std, eps):
    """Per (group, turn position): (r - mean) / (std + eps) over the valid turns of member rows."""
    rows, turns = turn_rewards.shape
    out = np.zeros((rows, turns), np.float64)
    for b in range(rows):
        for k in range(turns):
            if not turn_valid[b, k]:
                continue
            peers = [float(turn_rewards[c, k]) for c in range(rows)
                     if group_ids[c] == group_ids[b] and members[c] and turn_valid[c, k]]
            if len(peers) < 2:
                continue
            a = float(turn_rewards[b, k]) - np.mean(peers)
            std = np.std(peers, ddof=1)
            if normalize_std and std > 0:
                a = a / (std + eps)
            out[b, k] = a
    return out


def mix_turns(advantages, turn_advantages, turn_index, weight):
    out = np.asarray(advantages, np.float64).copy()
    for b, t in np.ndindex(turn_index.shape):
        if turn_index[b, t] >= 0:
            out[b, t] += weight * turn_advantages[b, turn_index[b, t]]
    return out


def gspo(new, old, advantages, mask, lo, hi):
    """verl compute_policy_loss_gspo, row by row. Returns (loss, clipped, dloss/dlogp): the token
    gradient is -A s_b where the unclipped branch is taken and 0 on the clipped branch
    (stop-gradient on the sequence ratio; s_b,t = s_b in value)."""
    loss = np.zeros(new.shape, np.float64)
    clipped = np.zeros(new.shape, bool)
    grad = np.zeros(new.shape, np.float64)
    for b in range(new.shape[0]):
        idx = np.flatnonzero(mask[b])
        log_s = np.mean(new[b, idx].astype(np.float64) - old[b, idx]) if len(idx) else 0.0
        s = np.exp(min(log_s, 10.0))
        for t in range(new.shape[1]):
            a = float(advantages[b, t])
            l1, l2 = -a * s, -a * min(max(s, 1 - lo), 1 + hi)
            loss[b, t] = max(l1, l2)
            clipped[b, t] = l2 > l1
            grad[b, t] = 0.0 if (l2 > l1 or log_s > 10.0) else -a * s
    return loss, clipped, grad


def gspo_sequence_objective(new, old, seq_advantages, mask, lo, hi):
    """GSPO's sequence-level objective as a loss (paper Eq. 5, negated; no stop-gradient):
    mean over rows with policy tokens of max(-A s_b, -A clip(s_b)). A function of `new` alone,
    so finite differences of it give its true gradient."""
    total, rows = 0.0, 0
    for b in range(new.shape[0]):
        idx = np.flatnonzero(mask[b])
        if not len(idx):
            continue
        s = np.exp(np.mean(new[b, idx].astype(np.float64) - old[b, idx]))
        a = float(seq_advantages[b])
        total += max(-a * s, -a * min(max(s, 1 - lo), 1 + hi))
        rows += 1
    return total / rows


def cispo(new, old, advantages, hi, lo=None):
    """MiniMax-M1 Eq. 4-5 per token: (loss, truncated, dloss/dlogp = -w A)."""
    loss = np.zeros(new.shape, np.float64)
    truncated = np.zeros(new.shape, bool)
    grad = np.zeros(new.shape, np.float64)
    for idx in np.ndindex(new.shape):
        r = np.exp(float(new[idx]) - float(old[idx]))
        w = min(r, 1 + hi) if lo is None else min(max(r, 1 - lo), 1 + hi)
        truncated[idx] = w != r
        loss[idx] = -w * float(advantages[idx]) * float(new[idx])
        grad[idx] = -w * float(advantages[idx])
    return loss, truncated, grad


SAFETY_BOUND = 20.0  # verl rollout_corr_helper: log-ratios clamped to [-20, 20] before exp


def rollout_ratios(old, rollout, mask, level):
    """The importance ratios pi_old / pi_rollout of verl rollout_corr_helper, [B, T] in float64:
    token: exp(clamp(old - rollout)); sequence: exp(clamp(sum over the row's valid tokens of
    (old - rollout))) on every token of the row."""
    ratio = np.ones(old.shape, np.float64)
    for b in range(old.shape[0]):
        idx = np.flatnonzero(mask[b])
        row_sum = sum(float(old[b, t]) - float(rollout[b, t]) for t in idx)
        for t in idx:
            log_ratio = float(old[b, t]) - float(rollout[b, t]) if level == "token" else row_sum
            ratio[b, t] = np.exp(min(max(log_ratio, -SAFETY_BOUND), SAFETY_BOUND))
    return ratio


def rollout_is_weights(old, rollout, mask, level, threshold):
    """verl compute_rollout_correction_weights (rollout_is = token | sequence, no batch
    normalisation): (truncated weights min(rho, threshold), 0 on padding; metrics on the valid
    tokens before truncation: mean, max; the share truncated)."""
    ratio = rollout_ratios(old, rollout, mask, level)
    valid = mask > 0
    weights = np.where(valid, np.minimum(ratio, threshold), 0.0)
    return weights, {"mean": ratio[valid].mean(), "max": ratio[valid].max(),
                     "clipped": (ratio[valid] > threshold).mean()}


def rollout_rs_mask(old, rollout, mask, level, lower, upper):
    """verl compute_rollout_rejection_mask (rollout_rs = token | sequence): the response mask with
    the tokens (rows) whose ratio lies outside [lower, upper] set to 0."""
    ratio = rollout_ratios(old, rollout, mask, level)
    return np.where((ratio >= lower) & (ratio <= upper), mask, 0.0)


def icepop_weights(old, rollout, mask, lower, upper):
    """IcePop's two-sided token mask M(k) = k if lower <= k <= upper else 0, k = pi_train / pi_infer
    (Ring-1T, "Small Leak Can Sink a Great Ship"); 0 on padding."""
    ratio = rollout_ratios(old, rollout, mask, "token")
    return np.where((mask > 0) & (ratio >= lower) & (ratio <= upper), ratio, 0.0)


def areal_decoupled_loss(logprobs, proximal, behaviour, advantages, mask, eps_low, eps_high, cap):
    """AReaL ppo_actor_loss_fn with the decoupled loss (token level, no dual clip), token by token:
    r = exp(logp - prox), L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) * w with the
    behaviour weight w = exp(prox - behav) where w <= cap (else 0), summed over the loss mask and
    divided by its count (a rejected token stays in the count)."""
    total, count = 0.0, 0
    for idx in zip(*np.nonzero(mask > 0)):
        a = float(advantages[idx])
        r = np.exp(float(logprobs[idx]) - float(proximal[idx]))
        w = np.exp(float(proximal[idx]) - float(behaviour[idx]))
        w = w if w <= cap else 0.0
        total += max(-a * r, -a * min(max(r, 1 - eps_low), 1 + eps_high)) * w
        count += 1
    return total / max(count, 1)

"""Advantage estimation for RLVER: GAE, group baselines (GRPO, RLOO, REINFORCE++), turn credit.

Shapes: B training rows (a dialogue each, or a turn each with think_history "drop"), T tokens,
N rows in a GRPO batch, G groups, K turns per row.
Every per-token array is aligned to the token it describes:
  mask[b, t]     1 exactly on policy-generated tokens (several assistant turns per row; user and
                 template tokens in between, and right padding, are 0), float or bool;
  rewards[b, t]  token-level reward; rewards live on policy tokens only (the final emotion / 100 on
                 the last policy token, or per turn on each turn's last policy token);
  values[b, t]   the critic's value of the state just before token t is emitted.
All functions are pure jnp and jit-friendly.
"""

import jax
import jax.numpy as jnp

Array = jax.Array


def _float(x: Array) -> Array:
    """Promotes to at least fp32: advantage statistics must not run in bf16."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def masked_mean(x: Array, mask: Array, axis: int | None = None) -> Array:
    """sum(x * m) / max(sum(m), 1) over `axis` (all axes when None); 0 where nothing is selected."""
    x = _float(x)
    m = jnp.asarray(mask).astype(x.dtype)
    return jnp.sum(x * m, axis=axis) / jnp.maximum(jnp.sum(m, axis=axis), 1.0)


def masked_var(x: Array, mask: Array, axis: int | None = None, *, ddof: int = 0) -> Array:
    """sum(m * (x - mean)^2) / max(sum(m) - ddof, 1): the variance of the selected entries."""
    x = _float(x)
    m = jnp.asarray(mask).astype(x.dtype)
    mean = masked_mean(x, m, axis)
    centered = x - (mean if axis is None else jnp.expand_dims(mean, axis))
    count = jnp.sum(m, axis=axis)
    return jnp.sum(m * centered**2, axis=axis) / jnp.maximum(count - ddof, 1.0)


def masked_whiten(x: Array, mask: Array, shift_mean: bool = True, eps: float = 1e-8) -> Array:
    """(x - mean) / sqrt(var + eps) over the selected entries of the whole array; 0 elsewhere.

    mean and var are taken over entries where mask is set; var is the unbiased (ddof=1) sample
    variance, as verl's masked_whiten. With shift_mean=False the mean is added back, so only the
    scale changes.
    """
    x = _float(x)
    m = jnp.asarray(mask).astype(x.dtype)
    mean = masked_mean(x, m)
    whitened = (x - mean) * jax.lax.rsqrt(masked_var(x, m, ddof=1) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * m


def gae_advantages(
    rewards: Array, values: Array, mask: Array, gamma: float | Array, lam: float | Array
) -> tuple[Array, Array]:
    """Generalised advantage estimation over the policy tokens of each row, [B, T] -> 2 x [B, T].

    The policy tokens of a row, in order t_1 < ... < t_K, form one trajectory; tokens with
    mask == 0 are skipped entirely, so a multi-turn dialogue is credited as a single episode:
      delta_k = r[t_k] + gamma * V[t_{k+1}] - V[t_k]      (V[t_{K+1}] = 0: terminal)
      A[t_k]  = delta_k + gamma * lam * A[t_{k+1}]        (A[t_{K+1}] = 0)
      R[t_k]  = A[t_k] + V[t_k]                           (lambda-return, the critic's target)
    Advantages and returns are 0 where mask == 0. Rewards must be placed on policy tokens: a
    reward on a masked-out position is not part of any action and is ignored.
    """
    rewards, values = _float(rewards), _float(values)
    dtype = jnp.promote_types(rewards.dtype, values.dtype)
    rewards, values = rewards.astype(dtype), values.astype(dtype)
    is_policy = jnp.asarray(mask).astype(bool)

    def step(carry, xs):
        next_value, next_adv = carry
        r, v, m = xs
        adv = r + gamma * next_value - v + gamma * lam * next_adv
        # Non-policy tokens pass the carry through unchanged, linking turn k's last token to turn
        # k+1's first token.
        carry = (jnp.where(m, v, next_value), jnp.where(m, adv, next_adv))
        return carry, jnp.where(m, adv, 0.0)

    batch = rewards.shape[0]
    init = (jnp.zeros((batch,), dtype), jnp.zeros((batch,), dtype))
    # Scan over time, so the per-step slices are [B].
    _, adv_TB = jax.lax.scan(step, init, (rewards.T, values.T, is_policy.T), reverse=True)
    advantages = adv_TB.T
    returns = jnp.where(is_policy, advantages + values, 0.0)
    return advantages, returns


def _group_offsets(
    scores: Array, group_ids: Array, num_groups: int, members: Array | None
) -> tuple[Array, Array, Array]:
    """(offset [N], member weight m [N], members per group [G]) for group statistics in fp32.

    offset_i = s_i - (the largest member score of i's group; 0 for a group without members).
    Offsets from a member of the group are exactly 0 for identical scores, so such a group gets
    A = 0 exactly; summing the raw scores would leave rounding noise that a std normalisation
    or a whitening then blows up.
    """
    scores = _float(scores)
    m = jnp.ones_like(scores) if members is None else jnp.asarray(members).astype(scores.dtype)
    count = jax.ops.segment_sum(m, group_ids, num_groups)
    anchor = jax.ops.segment_max(jnp.where(m > 0, scores, -jnp.inf), group_ids, num_groups)
    return scores - jnp.where(count > 0, anchor, 0.0)[group_ids], m, count


def grpo_advantages(
    scores: Array,
    group_ids: Array,
    num_groups: int,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
    members: Array | None = None,
) -> Array:
    """Group-relative outcome advantage per sequence, [N] -> [N].

    Sequence i belongs to group g = group_ids[i] (the n rollouts of one profile share an id in
    [0, num_groups); any order, groups may differ in size, e.g. when a dialogue was dropped):
      A_i = (s_i - mean_g) / (std_g + eps)   if normalize_std, else   A_i = s_i - mean_g
    where mean_g and std_g (the sample standard deviation, ddof=1) are taken over the group's
    `members` (bool [N]; default every sequence). With one row per dialogue turn, the members
    are each dialogue's first row, so the statistics run over dialogues, not turn rows. A group
    of identical scores, or of one member (no baseline), gets A = 0 exactly on every row (verl
    keeps the raw score for a group of one, over 1 + eps with the std). num_groups must be
    static under jit.
    """
    group_ids = jnp.asarray(group_ids)
    offset, m, count = _group_offsets(scores, group_ids, num_groups, members)
    mean_offset = jax.ops.segment_sum(offset * m, group_ids, num_groups) / jnp.maximum(count, 1.0)
    # A row whose group has fewer than two members has no baseline, members or not (the later
    # turn rows of a lone dialogue, whose scores may differ from its first row's).
    centered = jnp.where(count[group_ids] > 1, offset - mean_offset[group_ids], 0.0)
    if not normalize_std:
        return centered
    sq = jax.ops.segment_sum(centered**2 * m, group_ids, num_groups)
    # max(count - 1, 1): a group of one has std 0 instead of 0 / 0.
    std = jnp.sqrt(sq / jnp.maximum(count - 1.0, 1.0))[group_ids]
    # std == 0 only where every centered score is 0; keep A = 0 there even with eps = 0.
    return centered / jnp.where(std > 0, std + eps, 1.0)


def broadcast_to_tokens(seq_advantages: Array, mask: Array) -> Array:
    """A[b, t] = seq_advantages[b] * mask[b, t]: one outcome advantage on every policy token."""
    seq_advantages = _float(seq_advantages)
    return seq_advantages[:, None] * jnp.asarray(mask).astype(seq_advantages.dtype)


def rloo_advantages(
    scores: Array,
    group_ids: Array,
    num_groups: int,
    *,
    members: Array | None = None,
    dialogue_ids: Array | None = None,
) -> Array:
    """REINFORCE leave-one-out (RLOO) outcome advantage per row, [N] -> [N].

    Each row is compared with the mean score of the other dialogues of its group:
      A_i = s_i - sum_{j in O_i} s_j / |O_i|,   O_i = {j : group_j = group_i, members_j, d_j != d_i}
    with `members` (bool [N]; default every row) the rows that stand for a dialogue in the group
    statistics, and d_i the row's dialogue (`dialogue_ids`, int [N]; default: every row is a
    dialogue of its own). For a member row of a group of n members this is
      A_i = s_i - mean_{j != i} s_j = n / (n - 1) * (s_i - mean_g)
    (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740, after Kool et al. 2019; verl
    compute_rloo_outcome_advantage). With one row per dialogue turn, a turn row that is not its
    dialogue's member leaves that member out, so no row is ever compared with its own dialogue.
    A row with no other dialogue in its group (a group of one) gets A = 0, as verl's
    compute_rloo_vectorized_outcome_advantage (verl's loop version keeps the raw score there).
    A group of identical scores gets A = 0 exactly. num_groups must be static under jit; the
    dialogue ids are compared pairwise ([N, N]), so they need no bound.
    """
    group_ids = jnp.asarray(group_ids)
    offset, m, count = _group_offsets(scores, group_ids, num_groups, members)
    total = jax.ops.segment_sum(offset * m, group_ids, num_groups)[group_ids]
    if dialogue_ids is None:
        own_sum, own_count = offset * m, m
    else:
        dialogue_ids = jnp.asarray(dialogue_ids)
        # Elementwise sums rather than a matmul: an fp32 matmul may run in reduced precision.
        same_NN = ((dialogue_ids[:, None] == dialogue_ids[None, :])
                   & (group_ids[:, None] == group_ids[None, :]))
        own_sum = jnp.sum(jnp.where(same_NN, (offset * m)[None, :], 0.0), axis=1)
        own_count = jnp.sum(jnp.where(same_NN, m[None, :], 0.0), axis=1)
    others = count[group_ids] - own_count
    baseline = (total - own_sum) / jnp.maximum(others, 1.0)
    return jnp.where(others > 0, offset - baseline, 0.0)


def reinforce_pp_returns(
    rewards: Array, mask: Array, gamma: float | Array
) -> tuple[Array, Array]:
    """REINFORCE++ advantages and returns over the policy tokens of each row, [B, T] -> 2 x [B, T].

    With t_1 < ... < t_K the policy tokens of a row:
      G[t_k] = r[t_k] + gamma * G[t_{k+1}]     (G[t_{K+1}] = 0: discounted return-to-go)
      A      = masked_whiten(G, mask)          (mean, ddof=1 variance: the batch's policy tokens)
    (Hu 2025, REINFORCE++, arXiv:2501.03262; verl compute_reinforce_plus_plus_outcome_advantage).
    `rewards` may already carry a per-token KL penalty (losses.apply_kl_penalty), which then
    enters the returns as in the paper. Both outputs are 0 where mask == 0. This is gae_advantages
    with V = 0 and lam = 1, so tokens with mask == 0 are skipped and a multi-turn row is one
    episode. verl's loop instead restarts the return after every token with mask 0: the same for
    its single right-padded responses, but here it would cut the credit at every user turn.
    """
    rewards = _float(rewards)
    _, returns = gae_advantages(rewards, jnp.zeros_like(rewards), mask, gamma, 1.0)
    return masked_whiten(returns, mask), returns


def reinforce_pp_baseline_advantages(
    scores: Array,
    group_ids: Array,
    num_groups: int,
    mask: Array,
    *,
    members: Array | None = None,
) -> Array:
    """REINFORCE++-baseline advantages on tokens, scores [B] -> [B, T].

      A[b, t] = masked_whiten((s_b - mean_g) * mask)[b, t]
    where mean_g is the mean over the group's `members` as in grpo_advantages (normalize_std=False)
    and the whitening (mean and ddof=1 variance) runs over the batch's policy tokens (Hu 2025,
    arXiv:2501.03262; verl compute_reinforce_plus_plus_baseline_outcome_advantage). A group of one
    member has no baseline: its centred score is 0, where verl's loop keeps the raw score.
    """
    centered = grpo_advantages(scores, group_ids, num_groups, normalize_std=False, members=members)
    return masked_whiten(broadcast_to_tokens(centered, mask), mask)


def overlong_penalty(
    lengths: Array, max_tokens: int, buffer_len: int, penalty_factor: float
) -> Array:
    """DAPO's soft overlong punishment per response, added to its reward, [N] -> [N] fp32.

      R(l) = 0                                             l <= max_tokens - buffer_len
      R(l) = -penalty_factor * (l - max_tokens + buffer_len) / buffer_len   in between
      R(l) = -penalty_factor                               l > max_tokens
    (Yu et al. 2025, DAPO, arXiv:2503.14476, Eq. 13 with penalty_factor 1; verl's DAPO reward
    manager: min(-(l - (max - buffer)) / buffer * penalty_factor, 0), which is not capped beyond
    max_tokens because its responses cannot be longer; the cap here follows the paper.)
    max_tokens and buffer_len are static, 0 < buffer_len <= max_tokens.
    """
    if not 0 < buffer_len <= max_tokens:
        raise ValueError(f"need 0 < buffer_len <= max_tokens, got {buffer_len}, {max_tokens}")
    excess = _float(lengths) - (max_tokens - buffer_len)
    return -penalty_factor * jnp.clip(excess / buffer_len, 0.0, 1.0)


def degenerate_groups(
    scores: Array, group_ids: Array, num_groups: int, *, members: Array | None = None
) -> Array:
    """bool [G]: True where no two members of the group have different scores.

    Such a group gives every row a group-relative advantage of 0 (GRPO, RLOO), hence no gradient:
    DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476, Eq. 11: keep groups with
    0 < #correct < G) drops them and samples more. Scores are compared exactly. A group of one
    member, and an id without members, count as degenerate. num_groups must be static under jit.
    """
    scores = _float(scores)
    group_ids = jnp.asarray(group_ids)
    m = jnp.ones(scores.shape, bool) if members is None else jnp.asarray(members).astype(bool)
    hi = jax.ops.segment_max(jnp.where(m, scores, -jnp.inf), group_ids, num_groups)
    lo = jax.ops.segment_min(jnp.where(m, scores, jnp.inf), group_ids, num_groups)
    return ~(hi > lo)


def turn_group_advantages(
    turn_rewards: Array,
    turn_valid: Array,
    group_ids: Array,
    num_groups: int,
    *,
    members: Array | None = None,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> Array:
    """Turn-level group-relative advantages, [B, K] -> [B, K].

    turn_rewards[b, k] is the reward of turn k of row b (e.g. the emotion change it caused) and
    turn_valid[b, k] whether row b has a scored turn k; group_ids [B] and members [B] (default every
    row) as in grpo_advantages. A turn is compared with the turns at the same position k of the
    group's dialogues:
      A[b, k] = (r[b, k] - mean_{g,k}) / (std_{g,k} + eps)      (without / (std + eps) if not
                                                               normalize_std)
    with mean and sample std over S_{g,k} = {b' : group_b' = g, members_b', turn_valid[b', k]};
    A = 0 where turn_valid is 0, and where S_{g,k} has one entry or none (a turn position that only
    one dialogue reached has no baseline). This is grpo_advantages with the group id replaced by
    the pair (group, turn position): the turn-level term of MT-GRPO (Zeng et al. 2025,
    "Reinforcing Multi-Turn Reasoning in LLM Agents via Turn-Level Credit Assignment") and
    GiGPO's step-level groups (Feng et al. 2025, "Group-in-Group Policy Optimization"), whose
    groups of identical anchor states are approximated by the turn position.
    Layouts: one row per dialogue: row b holds its dialogue's turns, members its rows (default).
    One row per turn: row b is turn k of its dialogue with only turn_valid[b, k] set, and every
    row is a member (a dialogue has one row at each position).
    """
    valid_BK = jnp.asarray(turn_valid).astype(bool)
    # Invalid entries may hold anything (NaN included): they must not reach the group sums.
    rewards_BK = jnp.where(valid_BK, _float(turn_rewards), 0.0)
    rows, turns = rewards_BK.shape
    m_B = jnp.ones((rows,), bool) if members is None else jnp.asarray(members).astype(bool)
    ids_BK = jnp.asarray(group_ids)[:, None] * turns + jnp.arange(turns)[None, :]
    adv = grpo_advantages(
        rewards_BK.reshape(-1), ids_BK.reshape(-1), num_groups * turns,
        normalize_std=normalize_std, eps=eps, members=(valid_BK & m_B[:, None]).reshape(-1))
    return jnp.where(valid_BK, adv.reshape(rows, turns), 0.0)


def mix_turn_advantages(
    advantages: Array, turn_advantages: Array, turn_index: Array, turn_weight: float | Array
) -> Array:
    """A[b, t] = advantages[b, t] + turn_weight * turn_advantages[b, turn_index[b, t]], [B, T].

    advantages [B, T]: the dialogue-level advantage on the policy tokens (broadcast_to_tokens of
    grpo_advantages / rloo_advantages, or any per-token estimate); turn_advantages [B, K]
    (turn_group_advantages); turn_index [B, T] int: the turn, in [0, K), that token t of row b
    belongs to, and -1 where t is not a policy token (there A = advantages[b, t], 0 on such tokens).
    GiGPO's combination A = A_episode + omega * A_step (Feng et al. 2025); MT-GRPO puts the weight
    on the outcome term instead, which is this with the two inputs scaled.
    """
    turn_index = jnp.asarray(turn_index)
    turn_advantages = _float(turn_advantages)
    turns = turn_advantages.shape[1]
    placed = jnp.take_along_axis(turn_advantages, jnp.clip(turn_index, 0, turns - 1), axis=1)
    return _float(advantages) + turn_weight * jnp.where(turn_index >= 0, placed, 0.0)

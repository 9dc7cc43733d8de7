"""Reward sources: what a finished dialogue earns, one row of `REWARDS` per source
(`config.rl.reward_mode` names the row).

A source scores a dialogue once, where rollouts finish it (rlver_jax.rollout.episodes.EpisodeRunner,
as each dialogue ends, not after its batch), and `score` stores its `Reward` on the record
(rlver_jax.rollout.sequence.DialogueSequence: `reward`, `episode_rewards`, `turn_rewards`), so it
travels with the dialogue between processes and into its transcript. The collation
(rlver_jax.rl.batch), dynamic sampling, the summaries and the transcripts read it there and never
ask which source gave it: a new source is its function and its row here.

A source may be an `async def` (a served judge awaits its answer): `score` awaits it, so the event
loop on which every dialogue runs goes on playing the others meanwhile. The embedded sources are
plain functions, called directly.
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from collections.abc import Awaitable, Callable, Sequence

from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.table import Table, first_clause


@dataclasses.dataclass(frozen=True)
class Reward:
    """What a source gives one dialogue; the per-turn lists hold one entry per policy turn
    (`DialogueSequence.policy_turns`), None on a turn without a reward."""

    value: float  # the dialogue's reward: what summaries average and transcripts show
    # The update's rewards with the dialogue as one episode, each on its turn's last policy token
    # (rlver_jax.rl.batch.token_rewards sums them over later turns for a row per turn).
    episode: list[float | None]
    turns: list[float | None]  # each turn's own reward, for turn-level credit (rl.estimators.turn_credit)


def _paper_reward(seq: DialogueSequence) -> float:
    """The paper's reward: final emotion / 100, clipped at 0; 0 for a dialogue a format failure
    ended (rollout.format_failure "end"). Under "continue" the raw text reached the user and the
    dialogue keeps its reward, as in the reference."""
    if seq.ended_by_format_failure:
        return 0.0
    return max(seq.final_emotion, 0.0) / 100.0


def _emotion_changes(seq: DialogueSequence) -> list[float | None]:
    """Each scored turn's emotion change / 100 (None for a turn the user did not answer). A turn a
    format failure ended carries -(emotion before it) / 100, so the dialogue's return is
    (0 - initial emotion) / 100: the final reward of 0 minus the same constant as every other
    dialogue of its group."""
    e = seq.emotions
    changes: list[float | None] = [(e[i + 1] - e[i]) / 100.0 if i + 1 < len(e) else None
                                   for i in range(seq.policy_turns)]
    if seq.ended_by_format_failure and changes:
        changes[-1] = (0.0 if changes[-1] is None else changes[-1]) - e[-1] / 100.0
    return changes


def emotion_final(seq: DialogueSequence) -> Reward:
    """The paper's reward on the last policy turn; turn credit from the emotion changes."""
    changes = _emotion_changes(seq)
    value = _paper_reward(seq)
    return Reward(value, [None] * (len(changes) - 1) + [value] if changes else [], changes)


def emotion_per_turn(seq: DialogueSequence) -> Reward:
    """Each turn's emotion change / 100 on that turn, so GAE credits the turn that moved the user;
    the dialogue's reward (summaries, transcripts) stays the paper's, comparable with "final"."""
    changes = _emotion_changes(seq)
    return Reward(_paper_reward(seq), changes, changes)


Source = Callable[[DialogueSequence], Reward | Awaitable[Reward]]

# config.rl.reward_mode -> the source: a function of the finished dialogue (plain or async).
REWARDS: Table[Source] = Table("config.rl.reward_mode", {
    "final": emotion_final,
    "per_turn": emotion_per_turn,
}, summary=lambda f: first_clause(f.__doc__))


def shuffled(dialogues: Sequence[DialogueSequence], seed: int) -> list[DialogueSequence]:
    """The random-reward control: `dialogues` (scored by "final") with their rewards permuted among
    the trainable ones by a permutation `seed` draws, each on its own last policy turn; the emotions,
    turns and summaries stay the dialogue's own. New records; the originals are not changed."""
    trainable = [i for i, d in enumerate(dialogues) if d.trainable]
    order = random.Random(seed).sample(trainable, len(trainable))
    out = list(dialogues)
    for i, j in zip(trainable, order):
        d, value = dialogues[i], dialogues[j].reward
        episode = [None] * (d.policy_turns - 1) + [value] if d.policy_turns else []
        out[i] = dataclasses.replace(d, reward=value, episode_rewards=episode, turn_rewards=list(d.turn_rewards or []))
    return out


async def score(seq: DialogueSequence, name: str) -> DialogueSequence:
    """Store source `name`'s reward on `seq` (in place) and return it; an async source is awaited."""
    reward = REWARDS.row(name)(seq)
    if inspect.isawaitable(reward):
        reward = await reward
    if len(reward.episode) != seq.policy_turns or len(reward.turns) != seq.policy_turns:
        raise ValueError(f"reward source {name!r} gave dialogue {seq.profile_id} {len(reward.episode)} and "
                         f"{len(reward.turns)} turn rewards for its {seq.policy_turns} policy turns")
    seq.reward, seq.episode_rewards, seq.turn_rewards = reward.value, reward.episode, reward.turns
    return seq

"""Reward sources (rlver_jax.rollout.rewards): the emotion rows by hand, and a toy source added to the
table, scored where rollouts finish a dialogue and read from the record by the collation, dynamic
sampling, the summary and the transcript."""

import asyncio

import pytest

from configs.simulator import get_simulator_config
from rlver_jax.files import read_jsonl
from rlver_jax.rl import dynamic_sampling
from rlver_jax.rl.batch import collate
from rlver_jax.rl.settings import RLSettings
from rlver_jax.rollout import rewards
from rlver_jax.rollout.episodes import EpisodeRequest, EpisodeRunner, RolloutSettings
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.rollout.summary import rollout_metrics, summarize
from rlver_jax.rollout.transcripts import write_transcripts
from rlver_jax.simulator import SimulatorSettings, build_simulator
from rlver_jax.simulator.profiles import load_profiles
from rlver_jax.testing.scripted_server import ScriptedServer, route, system_prompt
from rlver_jax.text import chat
from tests.rollout_test import ScriptedTokenPolicy


@pytest.fixture(scope="module")
def chat_tokens(tiny_tokenizer_dir):
    return chat.ChatTokens.from_tokenizer(chat.load_tokenizer(tiny_tokenizer_dir))


def _dialogue(emotions, turns=2, **flags):
    return DialogueSequence(profile_id="p", group=0, tokens=[0, 1] * turns, policy_mask=[0, 1] * turns,
                            logprobs=[0.0] * 2 * turns, turn_ends=list(range(1, 2 * turns, 2)), emotions=emotions,
                            end_reason=flags.pop("end_reason", "turn_limit"), **flags)


def test_the_emotion_rows_by_hand():
    """final: the paper's reward (final emotion / 100, clipped at 0; 0 when a format failure ended
    the dialogue, kept under "continue") on the last turn; per_turn: each answered turn's change / 100,
    and a failed turn -(emotion before it) / 100. Both give the paper's reward as the dialogue's and
    the changes as turn credit."""
    final = rewards.emotion_final(_dialogue([30, 45, 38]))
    assert (final.value, final.episode) == (0.38, [None, 0.38])
    assert final.turns == pytest.approx([0.15, -0.07])
    assert rewards.emotion_final(_dialogue([30, 20, -4])).value == 0.0
    per_turn = rewards.emotion_per_turn(_dialogue([30, 45, 38]))
    assert per_turn.value == 0.38 and per_turn.episode == per_turn.turns == pytest.approx([0.15, -0.07])
    ended = _dialogue([30, 45], format_failure=True, end_reason="format_failure")
    assert rewards.emotion_final(ended).episode == [None, 0.0]
    assert rewards.emotion_per_turn(ended).episode == pytest.approx([0.15, -0.45])
    assert rewards.emotion_per_turn(ended).value == 0.0
    assert rewards.emotion_final(_dialogue([30, 45, 38], format_failure=True)).value == 0.38  # "continue"
    cut = rewards.emotion_per_turn(_dialogue([30, 45], truncated=True, end_reason="truncated"))
    assert cut.episode == [pytest.approx(0.15), None]  # the user never answered the cut turn
    assert rewards.emotion_final(_dialogue([40], turns=0)) == rewards.Reward(0.4, [], [])


def test_the_random_reward_control_permutes_the_rewards_of_a_batch():
    """rewards.shuffled: the trainable dialogues' final rewards permuted (a multiset kept), each on its
    new owner's last turn; a simulator error keeps none; the same seed, the same permutation."""
    batch = [asyncio.run(rewards.score(_dialogue([40, e], turns=1 + k % 2), "final"))
             for k, e in enumerate((10, 20, 30, 40))]
    batch.append(_dialogue([40], turns=1, simulator_error=True, end_reason="simulator_error"))
    out = rewards.shuffled(batch, seed=3)
    assert sorted(d.reward for d in out[:4]) == [0.1, 0.2, 0.3, 0.4] and out[4].reward is None
    assert [d.reward for d in out[:4]] != [0.1, 0.2, 0.3, 0.4]  # seed 3 moves them
    for d in out[:4]:
        assert d.episode_rewards == [None] * (d.policy_turns - 1) + [d.reward]
        assert d.emotions == batch[out.index(d)].emotions  # the dialogue itself is its own
    assert [d.reward for d in rewards.shuffled(batch, seed=3)] == [d.reward for d in out]
    assert [d.reward for d in batch[:4]] == [0.1, 0.2, 0.3, 0.4]  # the originals unchanged
    with pytest.raises(ValueError, match="shuffle_rewards with config.rl.reward_mode='per_turn'"):
        RLSettings(algo="grpo", reward_mode="per_turn", shuffle_rewards=True)


def test_an_unknown_name_is_one_error_naming_the_field():
    with pytest.raises(ValueError, match=r"config.rl.reward_mode='judge': use one of final \| per_turn$"):
        RLSettings(reward_mode="judge")
    with pytest.raises(ValueError, match=r"config.rl.reward_mode='judge'"):
        EpisodeRunner(None, None, None, RolloutSettings(), reward_mode="judge")


def brief(seq: DialogueSequence) -> rewards.Reward:
    """A toy shaping term on the paper's reward: 0.001 per character of each reply, charged on its turn."""
    emotion = rewards.emotion_final(seq)
    cost = [0.001 * len(t["reply"]) for t in seq.turns]
    return rewards.Reward(emotion.value - sum(cost), [(r or 0.0) - c for r, c in zip(emotion.episode, cost)],
                          emotion.turns)


def test_a_new_source_is_a_function_and_a_row(chat_tokens, tmp_path):
    """The scripted simulator moves every user 30 -> 40 -> 50 -> 60 over 3 turns, each reply "That
    sounds hard." (17 characters): each turn costs 0.017, so the episode's rewards are -0.017,
    -0.017 and 0.6 - 0.017 = 0.583, the dialogue's reward 0.6 - 3 * 0.017 = 0.549; turn credit stays
    the emotion changes, 0.1 a turn."""
    with rewards.REWARDS.added("brief", brief):
        seqs = _play_brief(chat_tokens)
    _check_brief(seqs, tmp_path)


def _play_brief(chat_tokens):
    assert RLSettings(algo="grpo", reward_mode="brief").reward_mode == "brief"
    script = route(emotion=lambda r: "Analysis: warm.\nChange: +15",
                   reply=lambda r: "Plan: keep talking.\nResponse: go on")
    with ScriptedServer(script) as server:
        cfg = get_simulator_config()
        cfg.update(base_url=server.base_url, max_turns=3, backoff_initial_s=0.01)
        runner = EpisodeRunner(ScriptedTokenPolicy(chat_tokens, ["That sounds hard."]),
                               build_simulator(SimulatorSettings.from_config(cfg)), chat_tokens,
                               RolloutSettings(think=False), reward_mode="brief")
        profile = next(p for p in load_profiles() if p.language == "en")
        return asyncio.run(runner.run([EpisodeRequest(profile, 0), EpisodeRequest(profile, 0)]))


def _check_brief(seqs, tmp_path):
    for s in seqs:
        assert s.emotions == [30.0, 40.0, 50.0, 60.0] and [t["reply"] for t in s.turns] == ["That sounds hard."] * 3
        assert s.reward == pytest.approx(0.549) and s.episode_rewards == pytest.approx([-0.017, -0.017, 0.583])
        assert s.turn_rewards == pytest.approx([0.1, 0.1, 0.1])
    batch = collate(seqs, batch_size=2, length_multiple=8)
    for b, s in enumerate(seqs):
        assert batch.rewards[b, s.turn_ends].tolist() == pytest.approx([-0.017, -0.017, 0.583])
        assert batch.rewards[b].sum() == pytest.approx(0.549)
        assert batch.turn_rewards[b, s.turn_ends].tolist() == pytest.approx([0.1, 0.1, 0.1])
    assert dynamic_sampling.groups_without_signal(seqs) == {0}  # both returned 0.549
    assert summarize(seqs).reward == pytest.approx(0.549)
    assert rollout_metrics(seqs)["reward_mean"] == pytest.approx(0.549)
    records = read_jsonl(write_transcripts(tmp_path, 0, seqs))
    assert [r["reward"] for r in records] == pytest.approx([0.549, 0.549])
    assert records[0]["episode_rewards"] == pytest.approx([-0.017, -0.017, 0.583])
    assert summarize([DialogueSequence.from_record(r) for r in records]).reward == pytest.approx(0.549)


def test_an_async_source_is_awaited_while_the_other_dialogues_play(chat_tokens):
    """A served judge's row: an `async def` that awaits. Two dialogues: the user of the first falls
    to the floor on its first turn (30 - 40 < 0: a failure), the second's rises 30 -> 45 -> 60 -> 75
    over 3 turns. The first's score waits until the second has been scored, so the second must play
    its last two turns while the first is being scored (a blocked event loop would time out); each
    reward reaches its record as a plain row's does (the paper's: 0 and 0.75)."""
    short, long = [p for p in load_profiles() if p.language == "en"][:2]
    scored, turns_seen, long_scored = [], {}, asyncio.Event()

    async def judged(seq):
        if seq.profile_id == short.id:
            turns_seen["long at the short's score"] = policy.calls
            await asyncio.wait_for(long_scored.wait(), timeout=30)
        else:
            long_scored.set()
        scored.append(seq.profile_id)
        return rewards.emotion_final(seq)

    script = route(emotion=lambda r: "Analysis: cold.\nChange: -40" if short.player[:20] in system_prompt(r)
                   else "Analysis: warm.\nChange: +15",
                   reply=lambda r: "Plan: keep talking.\nResponse: go on")
    policy = ScriptedTokenPolicy(chat_tokens, ["That sounds hard."])
    with rewards.REWARDS.added("judged", judged), ScriptedServer(script) as server:
        cfg = get_simulator_config()
        cfg.update(base_url=server.base_url, max_turns=3, max_change=100, backoff_initial_s=0.01)
        runner = EpisodeRunner(policy, build_simulator(SimulatorSettings.from_config(cfg)), chat_tokens,
                               RolloutSettings(think=False), reward_mode="judged")
        seqs = asyncio.run(runner.run([EpisodeRequest(short, 0), EpisodeRequest(long, 1)]))
    assert scored == [long.id, short.id]  # the short dialogue's score finished last
    assert turns_seen["long at the short's score"] < policy.calls  # policy turns were played meanwhile
    assert [(s.end_reason, len(s.turns)) for s in seqs] == [("failure", 1), ("turn_limit", 3)]
    assert [s.reward for s in seqs] == [0.0, pytest.approx(0.75)]
    assert [s.to_record()["reward"] for s in seqs] == [0.0, pytest.approx(0.75)]
    assert seqs[1].episode_rewards == [None, None, pytest.approx(0.75)]

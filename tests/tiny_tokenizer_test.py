"""Tests for rlver_jax.text.tiny_tokenizer: a locally trained Qwen2-style ChatML tokenizer."""

import json
import time
import unicodedata

import jinja2
import pytest
from transformers import AutoTokenizer

from rlver_jax.text.tiny_tokenizer import SPECIAL_TOKENS, build_tiny_tokenizer

ROUND_TRIP_TEXTS = [
    "I feel so tired after work today.",
    "今天工作好累，我真的撑不住了。",
    "谢谢你 😊🙏 see you 再见!",
    "<think>她很难过</think>\n听起来你真的很累了。",
    "  leading spaces,\ttabs\r\nand\n\n\nnewlines  ",
    # Decomposed "é" (e + combining acute): round-trips because there is no NFC normaliser.
    unicodedata.normalize("NFD", "café naïve"),
    "Здравствуйте, مرحبا, こんにちは, 안녕하세요",
    "text that spells <|im_end|> and <|endoftext|>",
    "",
]


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir):
    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def test_special_token_ids_and_roles(tokenizer):
    assert len(tokenizer) == 512
    assert tokenizer.get_added_vocab() == {
        "<think>": 507,
        "</think>": 508,
        "<|endoftext|>": 509,
        "<|im_start|>": 510,
        "<|im_end|>": 511,
    }
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 511
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 509
    assert tokenizer.bos_token is None
    # The think tags are single ordinary tokens: decoding keeps them.
    ids = tokenizer.encode("<think>hm</think>ok", add_special_tokens=False)
    assert ids[0] == 507 and 508 in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>hm</think>ok"
    # No BOS or other tokens are added around plain text.
    assert tokenizer("hi")["input_ids"] == tokenizer.encode("hi", add_special_tokens=False)


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    assert all(i < 509 for i in ids)  # Spelled control tokens stay text.
    assert tokenizer.decode(ids) == text


def test_chat_template_renders_chatml(tokenizer):
    messages = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "我很累"},
        {"role": "assistant", "content": "辛苦了"},
        {"role": "user", "content": "Thanks."},
    ]
    body = (
        "<|im_start|>system\nBe kind.<|im_end|>\n"
        "<|im_start|>user\n我很累<|im_end|>\n"
        "<|im_start|>assistant\n辛苦了<|im_end|>\n"
        "<|im_start|>user\nThanks.<|im_end|>\n"
    )
    assert tokenizer.apply_chat_template(messages, tokenize=False) == body
    assert (
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        == body + "<|im_start|>assistant\n"
    )
    # No default system message is inserted.
    assert tokenizer.apply_chat_template(messages[1:2], tokenize=False) == (
        "<|im_start|>user\n我很累<|im_end|>\n"
    )
    with pytest.raises(jinja2.TemplateError, match="Unsupported role: tool"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_deterministic_and_fast(tmp_path, tiny_tokenizer_dir):
    start = time.perf_counter()
    out = build_tiny_tokenizer(tmp_path / "again")
    assert time.perf_counter() - start < 2.0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in tiny_tokenizer_dir.iterdir())
    assert "tokenizer.json" in names
    for name in names:
        assert (out / name).read_bytes() == (tiny_tokenizer_dir / name).read_bytes(), name


def test_other_vocab_sizes(tmp_path):
    tok = AutoTokenizer.from_pretrained(build_tiny_tokenizer(tmp_path / "v300", vocab_size=300))
    assert len(tok) == 300
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [297, 298, 299]
    text = "听起来你真的很累了 😊"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    with pytest.raises(ValueError, match="256-byte alphabet"):
        build_tiny_tokenizer(tmp_path / "small", vocab_size=259)
    with pytest.raises(ValueError, match="more than the built-in corpus supports"):
        build_tiny_tokenizer(tmp_path / "huge", vocab_size=100_000)


def test_files_read_by_transformers_4_and_5(tiny_tokenizer_dir):
    """Written by tokenizer_files.save_tokenizer: the generic fast class (transformers 5 would give a
    "Qwen2Tokenizer" Qwen2's NFC normaliser, which this tokenizer lacks) and no 5-only keys."""
    config = json.loads((tiny_tokenizer_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert not config.keys() & {"backend", "extra_special_tokens", "is_local", "local_files_only"}
    assert config["additional_special_tokens"] == ["<|im_start|>"]
    assert {p.name for p in tiny_tokenizer_dir.iterdir()} == {
        "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"}

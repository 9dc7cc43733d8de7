"""ChatML conversations as exact token ids, the mask of policy tokens, and think-then-say parsing.

Qwen2.5 and SmolLM2 chat in ChatML: every message is

    <|im_start|>{role}\\n{content}<|im_end|>\\n

and a generation prompt is `<|im_start|>assistant\\n`. Both are read from the model's own tokenizer:
its <|im_start|>/<|im_end|> ids, and its chat template, rendered once on a probe conversation at
start-up, must be ChatML (its generation prompt the text after the last message); a template of
another family (Llama 3 headers, [INST], Gemma turns, ...) is refused, naming the family. Rollouts
build one training sequence per dialogue from the token ids the sampler produced plus the template
tokens around them (`generation_prompt_ids`, `assistant_turn_ids`, `encode_message`), never by
decoding to text and re-tokenising, which drifts. The assistant mask is 1 on the assistant's content tokens and on
its closing `<|im_end|>` (the policy samples it as its stop token), 0 everywhere else.

Agreement with `tokenizer.apply_chat_template` (tested in tests/chat_test.py): token for token
equal, with two documented exceptions.
1. Assistant content that starts with a newline (after optional other whitespace). The policy
   samples its content after the prompt's final "\\n" token, so the content's tokens start
   there; the template renders "assistant\\n\\nHi" as one text, and Qwen2's pre-tokeniser puts
   the newlines into one piece, which BPE may merge into one token. Our ids are what the
   policy actually sees and samples. System and user messages are encoded as one text with
   their "role\\n" header, so they agree.
2. Content that spells a control token, such as the text "<|im_end|>", stays text here: the
   template's default turns it into the control token, letting a user or simulator utterance end
   a turn early. Control tokens are the tokenizer's special tokens (for Qwen2.5 also its
   image/video slots); such text is tokenised as ordinary text in one pass, like tiktoken's
   encoding without special tokens. `apply_chat_template(..., sanitize_control_tokens=True)`
   keeps it text as well but tokenises the pieces around each spelled token apart, so with Qwen2.5
   the ids can differ where a space or punctuation touches it (the decoded text is the same).
Added tokens without the special flag (Qwen2.5's <tool_call>, </tool_call>, <|fim_*|>,
<|repo_name|>, <|file_sep|>; the tiny tokenizer's <think> tags) are ordinary vocabulary: one
token wherever their text appears, as transformers, and so any server rendering the template,
encodes them, and decoding keeps them. Sanitising them too would make training see other ids
than a server feeds the exported model for the same conversation (docs/tokenizers.md).
Also note: Qwen2.5's and SmolLM2's own templates insert a default system message when a conversation
has none ("You are Qwen, created by Alibaba Cloud. ...", "You are a helpful AI assistant named SmolLM,
trained by Hugging Face"); this module never does (rollouts pass the project's own system prompt).
A policy turn cut by the token budget may end inside a multi-byte character; `decode_turn` drops
that incomplete tail instead of showing U+FFFD.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # transformers (and torch with it) loads only when a tokenizer is loaded
    from transformers import PreTrainedTokenizerBase

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
ROLES = ("system", "user", "assistant")
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

_FIX = (
    "Point the config at a local Hugging Face tokenizer directory of a ChatML model such as "
    "Qwen2.5 or SmolLM2 (with tokenizer.json and tokenizer_config.json), or build the CPU test "
    "tokenizer with rlver_jax.text.tiny_tokenizer.build_tiny_tokenizer(dir)."
)
# A probe conversation, and the ChatML text of it (without a generation prompt).
_PROBE = ({"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"})
_PROBE_CHATML = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in _PROBE)
# Marks of other chat-template families, for the refusal's message.
_FAMILIES = (("<|start_header_id|>", "Llama 3 (<|start_header_id|> headers)"),
             ("[INST]", "Llama 2 / Mistral ([INST] blocks)"), ("<start_of_turn>", "Gemma (<start_of_turn>)"),
             ("<|user|>", "Zephyr / Phi-3 (<|user|> tags)"), ("<|User|>", "DeepSeek (<|User|> tags)"),
             ("### Instruction", "Alpaca (### Instruction)"), (IM_START, "ChatML-like, but rendered differently"))


def _text_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    # split_special_tokens: text that spells a special (control) token is encoded as plain text;
    # non-special added tokens stay one token (see the module docstring).
    return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


@dataclasses.dataclass(frozen=True)
class ChatTokens:
    """ChatML token ids of one tokenizer, plus the tokenizer for encoding message contents.

    Build once with `ChatTokens.from_tokenizer` and pass it to this module's functions, which
    also accept the tokenizer itself (and then rebuild this, a few short encodes).
    """

    tokenizer: PreTrainedTokenizerBase = dataclasses.field(repr=False, compare=False)
    im_start: int
    im_end: int
    end_of_text: int
    newline: tuple[int, ...]
    # "<|im_start|>{role}\n" per role.
    system_header: tuple[int, ...]
    user_header: tuple[int, ...]
    assistant_header: tuple[int, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer: PreTrainedTokenizerBase) -> "ChatTokens":
        """Reads the ids and the generation prompt from `tokenizer`; a ValueError names the missing
        ChatML tokens, or the family of a chat template that is not ChatML."""
        added = tokenizer.get_added_vocab()
        missing = [t for t in (IM_START, IM_END, END_OF_TEXT) if t not in added]
        if missing:
            raise ValueError(
                f"tokenizer {tokenizer.name_or_path!r} lacks the ChatML special tokens "
                f"{missing}; it is not a ChatML tokenizer. {_FIX}"
            )
        im_start = added[IM_START]

        def header(role: str) -> tuple[int, ...]:
            return (im_start, *_text_ids(tokenizer, role + "\n"))

        # The template's own generation prompt, as ids with its control tokens.
        prompt_ids = tuple(tokenizer.encode(chatml_generation_prompt(tokenizer), add_special_tokens=False))
        if prompt_ids != header("assistant"):
            raise ValueError(f"tokenizer {tokenizer.name_or_path!r}: the chat template's generation prompt "
                             f"encodes as {list(prompt_ids)}, not as <|im_start|> + 'assistant\\n'. {_FIX}")
        return cls(
            tokenizer=tokenizer,
            im_start=im_start,
            im_end=added[IM_END],
            end_of_text=added[END_OF_TEXT],
            newline=tuple(_text_ids(tokenizer, "\n")),
            system_header=header("system"),
            user_header=header("user"),
            assistant_header=prompt_ids,
        )

    def header(self, role: str) -> tuple[int, ...]:
        """The ids of "<|im_start|>{role}\\n"."""
        _check_role(role)
        return getattr(self, f"{role}_header")


def template_family(template: str) -> str:
    """The family a chat template that is not plain ChatML belongs to, by its marks."""
    return next((family for mark, family in _FAMILIES if mark in template), "unknown (no known role marks)")


def chatml_generation_prompt(tokenizer: PreTrainedTokenizerBase) -> str:
    """The generation prompt of `tokenizer`'s chat template, checked to be ChatML: the template must
    render a system/user/assistant probe as ChatML text; the prompt is what it adds after it. A
    ValueError (one line) names the template's family otherwise."""
    name = tokenizer.name_or_path
    template = tokenizer.chat_template
    if not isinstance(template, str):  # None, or a dict of named templates (tool use, RAG)
        raise ValueError(f"tokenizer {name!r} has no single chat template ({type(template).__name__}); "
                         f"a ChatML template is needed. {_FIX}")
    try:
        plain = tokenizer.apply_chat_template(list(_PROBE), tokenize=False)
        prompted = tokenizer.apply_chat_template(list(_PROBE), tokenize=False, add_generation_prompt=True)
    except Exception as e:  # a template that rejects the probe (e.g. no system role) is not ChatML
        plain = prompted = f"error: {e}"
    if plain != _PROBE_CHATML or not prompted.startswith(plain):
        raise ValueError(f"tokenizer {name!r}: its chat template is not ChatML but {template_family(template)}; "
                         f"this project trains and samples ChatML conversations. {_FIX}")
    return prompted[len(plain):]


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"unsupported chat role {role!r}; expected one of {ROLES}")


def _chat_tokens(chat: ChatTokens | PreTrainedTokenizerBase) -> ChatTokens:
    return chat if isinstance(chat, ChatTokens) else ChatTokens.from_tokenizer(chat)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Loads a ChatML tokenizer from a local directory; never contacts a model hub."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {str(path)!r} does not exist. {_FIX}")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"could not load a tokenizer from {str(path)!r}: {e}\n{_FIX}") from e
    ChatTokens.from_tokenizer(tokenizer)  # Fails early, naming the path, on a non-ChatML one.
    return tokenizer


def generation_prompt_ids(chat: ChatTokens | PreTrainedTokenizerBase) -> list[int]:
    """The ids of "<|im_start|>assistant\\n", after which the policy samples its turn."""
    return list(_chat_tokens(chat).assistant_header)


def assistant_turn_ids(
    chat: ChatTokens | PreTrainedTokenizerBase, generated_ids: Iterable[int]
) -> tuple[list[int], list[int]]:
    """Closes an assistant turn from the sampled ids; returns (ids, mask) to follow the prompt.

    `generated_ids` are the tokens sampled after `generation_prompt_ids`, ending with the stop
    token `<|im_end|>` when the policy stopped by itself. All of them are masked 1. When the
    turn was cut (no final `<|im_end|>`) the template's `<|im_end|>` is added with mask 0, since
    the policy never sampled it. The trailing "\\n" is template, mask 0.
    """
    ct = _chat_tokens(chat)
    generated = [int(t) for t in generated_ids]
    if ct.im_end in generated[:-1]:
        raise ValueError(
            "generated_ids hold <|im_end|> before their last position; trim the sampler's "
            "output after its stop token"
        )
    ids = generated + ([] if generated[-1:] == [ct.im_end] else [ct.im_end])
    ids += ct.newline
    mask = [1] * len(generated) + [0] * (len(ids) - len(generated))
    return ids, mask


def encode_message(
    chat: ChatTokens | PreTrainedTokenizerBase, role: str, content: str
) -> tuple[list[int], list[int]]:
    """One whole ChatML message as (ids, mask); the mask is 1 only on assistant tokens.

    Assistant content is encoded on its own after the header, as the policy would sample it;
    system and user messages are encoded as one text "{role}\\n{content}" after <|im_start|>, as
    the chat template does.
    """
    ct = _chat_tokens(chat)
    _check_role(role)
    if role == "assistant":
        body, body_mask = assistant_turn_ids(ct, _text_ids(ct.tokenizer, content) + [ct.im_end])
        header = list(ct.assistant_header)
        return header + body, [0] * len(header) + body_mask
    ids = [ct.im_start, *_text_ids(ct.tokenizer, f"{role}\n{content}"), ct.im_end, *ct.newline]
    return ids, [0] * len(ids)


def conversation_ids(
    chat: ChatTokens | PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, str]],
    *,
    add_generation_prompt: bool = False,
) -> tuple[list[int], list[int]]:
    """A whole conversation ({"role", "content"} dicts) as (ids, assistant mask)."""
    ct = _chat_tokens(chat)
    ids: list[int] = []
    mask: list[int] = []
    for message in messages:
        m_ids, m_mask = encode_message(ct, message["role"], message["content"])
        ids += m_ids
        mask += m_mask
    if add_generation_prompt:
        prompt = generation_prompt_ids(ct)
        ids += prompt
        mask += [0] * len(prompt)
    return ids, mask


def decode_turn(chat: ChatTokens | PreTrainedTokenizerBase, text_ids: Sequence[int], cut: bool) -> str:
    """The text of a policy turn's ids (without its stop token). A turn `cut` by the token budget may
    end inside a multi-byte character: those incomplete bytes are dropped (the decoder would show
    them as U+FFFD), so the simulated user and the transcripts never see a broken character."""
    ct = _chat_tokens(chat)
    text = ct.tokenizer.decode(list(text_ids), skip_special_tokens=False)
    # An incomplete UTF-8 tail is at most 3 bytes, so within the last 3 tokens; decoders show it as
    # one U+FFFD (the maximal ill-formed subpart).
    if cut and text.endswith("\ufffd") and _incomplete_utf8_tail(_token_bytes(ct.tokenizer, text_ids[-3:])):
        text = text[:-1]
    return text


def _byte_level_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's): printable Latin-1 bytes stand for themselves, the other
    bytes for the code points 256, 257, ... in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(256 + i): b for i, b in enumerate(shifted)}}


_BYTE_LEVEL = _byte_level_decoder()
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte tokens


def _token_bytes(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> bytes:
    """The bytes the tokens `ids` stand for: byte-level BPE pieces through its alphabet, byte-fallback
    pieces as their byte, added tokens as their UTF-8 text."""
    added = set(tokenizer.get_added_vocab())
    out = bytearray()
    for piece in tokenizer.convert_ids_to_tokens(list(ids)):
        match = _BYTE_FALLBACK.fullmatch(piece)
        if match:
            out.append(int(match.group(1), 16))
        elif piece not in added and all(c in _BYTE_LEVEL for c in piece):
            out += bytes(_BYTE_LEVEL[c] for c in piece)
        else:
            out += piece.encode("utf-8")
    return bytes(out)


def _incomplete_utf8_tail(data: bytes) -> bool:
    """Whether `data` ends with the start of a multi-byte UTF-8 character and not all of it."""
    for back in range(1, min(3, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back for the lead byte
            continue
        length = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return back < length
    return False


# A speaker label the policy may write before its reply ("你：", "Me:", "**Reply:**"); the user
# must not read it. Only a leading label of these names is stripped, so text that merely
# contains a colon is left alone.
_SPEAKER_LABEL = re.compile(
    r"^\s*(?:\*\*)?[\[【(（]?(?:你|我|回复|回答|朋友|助手|me|you|reply|response|answer|friend|assistant)"
    r"[\]】)）]?(?:\*\*)?\s*[:：]\s*(?:\*\*)?\s*",
    re.IGNORECASE,
)


def strip_speaker_label(text: str) -> str:
    """`text` without a leading speaker label (你：, 你:, Me:, **Reply:** and the like)."""
    return _SPEAKER_LABEL.sub("", text, count=1)


@dataclasses.dataclass(frozen=True)
class ThinkSplit:
    """A policy turn split into its reasoning and the reply shown to the simulated user."""

    thinking: str
    reply: str
    ok: bool  # False marks a format failure: no closing </think>, or an empty reply.


def split_think(text: str, *, think: bool = True) -> ThinkSplit:
    """Splits a decoded policy turn into thinking and reply.

    Think mode: the reply is the text after the last "</think>" (as the reference rollout
    splits), stripped, without a leading speaker label; the thinking is the text before it,
    without a leading "<think>". No "</think>" is a format failure (the reply is then empty).
    No-think mode: the whole stripped text, without a speaker label, is the reply. In both modes
    an empty reply is a format failure, since there is nothing to say to the user.
    """
    if not think:
        reply = strip_speaker_label(text.strip())
        return ThinkSplit(thinking="", reply=reply, ok=bool(reply))
    head, closed, tail = text.rpartition(THINK_CLOSE)
    thinking = (head if closed else tail).strip()
    if thinking.startswith(THINK_OPEN):
        thinking = thinking[len(THINK_OPEN):].strip()
    reply = strip_speaker_label(tail.strip()) if closed else ""
    return ThinkSplit(thinking=thinking, reply=reply, ok=bool(closed) and bool(reply))


def shown_text(text: str, split: ThinkSplit) -> str:
    """What the simulated user reads of a policy turn `text` (split by `split_think`): the reply,
    or after a format failure the raw text, stripped and without a speaker label (the reference
    sends a reply without "</think>" as it is)."""
    return split.reply if split.ok else strip_speaker_label(text.strip())

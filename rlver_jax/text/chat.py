"""ChatML conversations as exact token ids, the mask of policy tokens, and think-then-say parsing.

Qwen2.5 chats in ChatML: every message is

    <|im_start|>{role}\\n{content}<|im_end|>\\n

and a generation prompt is `<|im_start|>assistant\\n`. Rollouts build one training sequence per
dialogue from the token ids the sampler produced plus the template tokens around them
(`generation_prompt_ids`, `assistant_turn_ids`, `encode_message`), never by decoding to text and
re-tokenising, which drifts. The assistant mask is 1 on the assistant's content tokens and on
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
Also note: Qwen2.5's own template inserts a default system message when a conversation has
none; this module never does (rollouts pass the project's own system prompt).
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
    "Point the config at a local Hugging Face tokenizer directory of a Qwen2/Qwen2.5 model "
    "(with tokenizer.json and tokenizer_config.json), or build the CPU test tokenizer with "
    "rlver_jax.text.tiny_tokenizer.build_tiny_tokenizer(dir)."
)


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
        """Reads the ids from `tokenizer`; a ValueError names the missing ChatML tokens."""
        added = tokenizer.get_added_vocab()
        missing = [t for t in (IM_START, IM_END, END_OF_TEXT) if t not in added]
        if missing:
            raise ValueError(
                f"tokenizer {tokenizer.name_or_path!r} lacks the ChatML special tokens "
                f"{missing}; it is not a Qwen2/ChatML tokenizer. {_FIX}"
            )
        im_start = added[IM_START]

        def header(role: str) -> tuple[int, ...]:
            return (im_start, *_text_ids(tokenizer, role + "\n"))

        return cls(
            tokenizer=tokenizer,
            im_start=im_start,
            im_end=added[IM_END],
            end_of_text=added[END_OF_TEXT],
            newline=tuple(_text_ids(tokenizer, "\n")),
            system_header=header("system"),
            user_header=header("user"),
            assistant_header=header("assistant"),
        )

    def header(self, role: str) -> tuple[int, ...]:
        """The ids of "<|im_start|>{role}\\n"."""
        _check_role(role)
        return getattr(self, f"{role}_header")


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

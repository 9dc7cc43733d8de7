"""A small Qwen2-style byte-level BPE tokenizer, trained locally for tests and the "tiny" preset.

Nothing is downloaded: the tokenizer is trained in well under a second on the built-in corpus
below (short English and Chinese sentences about feelings and friendship, written for this
project) and saved as a Hugging Face tokenizer directory (`tokenizer_files.save_tokenizer`) that
`transformers.AutoTokenizer.from_pretrained` loads, in transformers 4.x and 5.x alike.

Like Qwen2's tokenizer it splits text with Qwen2's pre-tokenisation regex, maps bytes to
printable characters (ByteLevel) and decodes them back, so any Unicode text round-trips, Chinese
and emoji included. Unlike Qwen2 it has no NFC normaliser, so even non-NFC text round-trips
byte for byte (and its tokenizer_config.json names the generic PreTrainedTokenizerFast class, not
Qwen2Tokenizer, whose loader in transformers 5 would add NFC).

Token ids: ids 0..vocab_size-6 are the byte alphabet and the learnt merges; then the think tags
`<think>` = vocab_size - 5 and `</think>` = vocab_size - 4 as single ordinary (non-special)
tokens, so a random tiny policy can stumble on the think-then-say format often enough for RL to
learn it (spelt in three byte-level pieces, a random model would essentially never write it);
the three special tokens come last, in the order of `SPECIAL_TOKENS` (as in Qwen2, where they
follow the BPE vocabulary):

    <|endoftext|> = vocab_size - 3   (pad)
    <|im_start|>  = vocab_size - 2
    <|im_end|>    = vocab_size - 1   (eos: the end of every chat turn)

With the default vocab_size=512 these are 509, 510 and 511. Keeping the pad id non-zero, as in
Qwen2, lets tests catch code that silently assumes padding is token 0.
"""

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rlver_jax.text.tokenizer_files import QWEN2_SPLIT, save_tokenizer

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK_TOKENS = ("<think>", "</think>")

# ChatML without a default system message. The `generation` block marks what the policy writes
# (assistant content plus its closing <|im_end|>), so `apply_chat_template(...,
# return_assistant_tokens_mask=True)` gives an independent check of rlver_jax.text.chat's mask.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('Unsupported role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- message['content'] + '<|im_end|>' -}}{%- endgeneration -%}"
    "{%- else -%}"
    "{{- message['content'] + '<|im_end|>' -}}"
    "{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Written for this project. Repeated chat words make the role names (as in "role\n" headers),
# "<think>", "</think>" and "\n\n" frequent enough to become tokens of their own, as in Qwen2.
_CORPUS = (
    "system\nuser\nassistant\n" * 4,
    "<think>\nThe user sounds tired.\n</think>\n\nThat sounds exhausting.",
    "<think>\n她很难过，我先安慰她。\n</think>\n\n听起来你真的很累了。",
    "<think>\nListen first\n</think>\n\nI hear you\n\nYou matter\n\nTell me more\n\nTake care",
    "I feel so tired after work today.",
    "My boss yelled at me in front of everyone.",
    "I'm worried that I will lose my job.",
    "My best friend forgot my birthday again.",
    "I don't know who I can talk to about this.",
    "That sounds really hard. I'm here for you.",
    "It makes sense that you feel hurt.",
    "You are not alone, and it is not your fault.",
    "Do you want to tell me more about what happened?",
    "Thank you for listening to me, I feel a little better.",
    "Sometimes I feel lonely even with friends around.",
    "The deadline is tomorrow and I haven't slept.",
    "We had a fight and she stopped replying to my messages.",
    "Maybe we can take a short walk and clear your head.",
    "I'm proud of you for getting through this week.",
    "It's okay to rest. You've worked so hard.",
    "Work stress is making me anxious every night.",
    "I miss my family, they live far away.",
    "How are you feeling right now?",
    "Goodbye, talk to you later!",
    "Bye! Take care of yourself.",
    "你是一个温暖、善解人意的朋友。",
    "今天工作好累，我真的撑不住了。",
    "老板当着大家的面批评我，我很难受。",
    "我担心自己会丢掉这份工作。",
    "最好的朋友又忘了我的生日。",
    "我不知道可以和谁说这些事情。",
    "听起来真的很难，我一直都在。",
    "你会觉得受伤，这很正常。",
    "这不是你的错，你并不孤单。",
    "愿意多和我说说发生了什么吗？",
    "谢谢你听我说话，我感觉好一点了。",
    "有时候和朋友在一起，我也觉得孤独。",
    "明天就要交报告了，我一晚上没睡。",
    "我们吵架了，她不回我的消息。",
    "要不要出去走走，让心情放松一下？",
    "这一周你坚持下来了，我为你骄傲。",
    "休息一下也没关系，你已经很努力了。",
    "工作压力让我每天晚上都很焦虑。",
    "我好想家人，他们住得很远。",
    "你现在感觉怎么样？",
    "再见，下次再聊！",
    "拜拜，照顾好自己。",
)


def build_tiny_tokenizer(out_dir: str | Path, vocab_size: int = 512) -> Path:
    """Trains the tiny tokenizer and saves it to `out_dir`; returns the directory.

    Deterministic: the same arguments write the same files. `vocab_size` counts the think
    tags and the three special tokens; it must leave room for the 256-byte alphabet and fit what the corpus can
    merge (a ValueError says so otherwise).
    """
    n_added = len(SPECIAL_TOKENS) + len(THINK_TOKENS)
    if vocab_size <= 256 + n_added:
        raise ValueError(f"vocab_size={vocab_size} leaves no room for the 256-byte alphabet")
    n_regular = vocab_size - n_added
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            # The split above replaces ByteLevel's GPT-2 regex, as in Qwen2.
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=n_regular,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS, trainer=trainer)
    if backend.get_vocab_size() != n_regular:
        raise ValueError(
            f"vocab_size={vocab_size} is more than the built-in corpus supports "
            f"({backend.get_vocab_size() + n_added} at most)"
        )
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return save_tokenizer(tokenizer, out_dir)

"""What the embedded simulated user says after each reply: its own story, a sentence a turn.

The lines come from the profile: the sentences of the scene's background and current state (the
text before its hidden theme), turned into the first person (the user's name and the pronouns of
the user's gender become I, me, my; a verb right after a new "I" agrees with it), in order, one a
turn; when they run out they come round again, each after a lead-in. What the user says does not
depend on how the reply was judged, so a policy can neither read its verdict in the user's words
nor memorise answers to a few stock lines; it has to take up what the user tells. The goodbye when
the emotion falls into band F (embedded.py) is the one line the judgement chooses.
"""

from __future__ import annotations

import functools
import re

from rlver_jax.simulator.profiles import Profile

# Where the told part of a scene ends (its hidden theme and the notes on reactions follow).
_HIDDEN = re.compile(r"^#+\s*(?:Hidden theme|隐藏主题|不同情绪|对回复的反应|Reactions)|^#+\s*\d*\.?\s*玩家不同状态|"
                     r"^\s*#+\s*隐藏主题", re.MULTILINE | re.IGNORECASE)
_HEADING = re.compile(r"^\s*(?:#+.*|\*\*[^*]+[:：]\*\*\s*|[-*]\s*\*\*[^*]+\*\*\s*)$", re.MULTILINE)
_SENTENCE = re.compile(r"[^.!?。！？\n]+(?:[.!?。！？]+[\"'”’]?|$)", re.MULTILINE)
_NAME = re.compile(r"^\s*\*?\s*(?:Name|姓名)\s*[:：]\s*(.+?)\s*$", re.MULTILINE | re.IGNORECASE)
_GENDER = re.compile(r"^\s*\*?\s*(?:Gender|性别)\s*[:：]\s*(.+?)\s*$", re.MULTILINE | re.IGNORECASE)
_MIN_CHARS = {"en": 12, "zh": 6}  # shorter pieces (list numbers, labels) are not lines
LEAD_INS = {
    "en": ("I keep coming back to it.", "Like I said,", "It's just that", "Honestly,", "The thing is,"),
    "zh": ("我还是一直在想，", "就像我说的，", "其实就是，", "说真的，", "问题是，"),
}
# English: the gender's pronouns in the first person; "her" is "my" before a word, else "me".
_PRONOUNS = {"male": {"he": "I", "him": "me", "his": "my", "himself": "myself"},
             "female": {"she": "I", "hers": "mine", "herself": "myself"}}
# A verb right after a new "I" agrees with it.
_AGREE = {"is": "am", "was": "was", "has": "have", "does": "do", "doesn't": "don't", "isn't": "am not",
          "hasn't": "haven't", "goes": "go", "he's": "I'm", "she's": "I'm"}
_ADVERBS = frozenset("never always still often now just also barely rarely really even only hardly already".split())
_NOT_VERBS = frozenset("was has is does as us this thus plus yes bus always perhaps".split())
# Verbs a sentence's "I" also governs after "and", "but" or a comma ("I lie awake and draft...").
_LATER_VERBS = frozenset("""wonders keeps feels knows tells takes lies drafts studies pays hides eats leaves has is
does wants thinks says tries spends works misses worries hopes blames avoids replays dreads asks cries""".split())
_FOLLOWS_HER_AS_OBJECT = frozenset("""to with at for about from by of in on and or but that if when so as than again
too anymore since back up out off down away a an the i he she they we it you feel be go do know think want stop leave
come cry look sound seem""".split())
# A name after one of these is the object: "me", not "I".
_BEFORE_OBJECT = frozenset("""to with at for about from by of on than like told asked gave called sent left thanked
avoided invited blamed made let helped showed offered promoted hired fired tells asks gives calls sends leaves thanks
avoids invites blames makes lets helps shows offers reach recognise recognize want wants see saw meet met tell ask
call thank pay paid help trust love miss keep kept find found""".split())
# Others of the user's gender named before a pronoun make it theirs, not the user's.
_OTHERS = {"female": frozenset("mother sister daughter wife girlfriend aunt grandmother niece woman girl mum".split()),
           "male": frozenset("father brother son husband boyfriend uncle grandfather nephew man boy dad".split())}
_NOT_NAMES = frozenset("""monday tuesday wednesday thursday friday saturday sunday january february march april may june
july august september october november december christmas i""".split())


def _gender(player: str) -> str:
    found = _GENDER.search(player)
    text = found.group(1).lower() if found else ""
    return "female" if ("female" in text or "woman" in text or "女" in text) else "male"


def _names(player: str) -> tuple[str, ...]:
    """The user's names as the scene writes them: the full name, then (English) the first name."""
    found = _NAME.search(player)
    if not found:
        return ()
    full = found.group(1).strip().strip("*")
    return (full, full.split()[0]) if " " in full else (full,)


def _agree(word: str) -> str:
    """A third-person verb after a new "I": is -> am, tries -> try, drafts -> draft."""
    low = word.lower()
    if low in _AGREE:
        return _AGREE[low]
    if low in _NOT_VERBS or not low.endswith("s") or low.endswith("ss") or len(low) < 4:
        return word
    if low.endswith("ies") and len(low) > 4:
        return word[:-3] + "y"
    if low.endswith(("ches", "shes", "xes", "sses", "zes")):
        return word[:-2]
    return word[:-1]


def _first_person_en(sentence: str, names: tuple[str, ...], gender: str) -> str:
    tokens = re.findall(r"[A-Za-z']+|[^A-Za-z']+", sentence)
    words = [(i, t) for i, t in enumerate(tokens) if t[0].isalpha()]
    subject = said_i = others = False  # agree the next verb; the sentence's "I"; another of the user's gender
    for k, (i, token) in enumerate(words):
        low, before = token.lower(), words[k - 1][1].lower() if k else ""
        following = next((t.lower() for t in tokens[i + 1:] if t.strip()), "")
        bare = low[:-2] if low.endswith("'s") else low
        if bare in {n.lower() for n in names}:
            objective = before in _BEFORE_OBJECT or (before.endswith("ed") and before != "need")
            new = "my" if low.endswith("'s") else "me" if objective else "I"
        elif low in _PRONOUNS[gender] and not others:
            new = _PRONOUNS[gender][low]
        elif gender == "female" and low == "her" and not others:
            new = "me" if not following or following in _FOLLOWS_HER_AS_OBJECT or not following[0].isalpha() else "my"
        elif (subject and low not in _ADVERBS) or (said_i and before in ("and", "but") and low in _LATER_VERBS):
            new = _agree(token)
        else:
            new = token
            others = others or low in _OTHERS[gender] or (k > 0 and token[0].isupper() and low not in _NOT_NAMES)
        subject = new == "I" or (subject and low in _ADVERBS)
        said_i = said_i or new == "I"
        tokens[i] = new
    text = "".join(tokens)
    return text[0].upper() + text[1:] if text else text


def _first_person_zh(sentence: str, names: tuple[str, ...], gender: str) -> str:
    for name in names:
        sentence = sentence.replace(name, "我")
    return sentence.replace("她" if gender == "female" else "他", "我")


@functools.lru_cache(maxsize=1024)
def story(profile: Profile) -> tuple[str, ...]:
    """The profile's told sentences in the first person, in order (see the module docstring)."""
    language = profile.language
    told = _HIDDEN.split(profile.scene, 1)[0]
    told = _HEADING.sub("", told).replace("**", "")
    names, gender = _names(profile.player), _gender(profile.player)
    convert = _first_person_zh if language == "zh" else _first_person_en
    lines = []
    for piece in _SENTENCE.findall(told):
        piece = re.sub(r"^[\s\-*•\d.、)）]+", "", piece).strip()
        if len(piece) >= _MIN_CHARS[language]:
            lines.append(convert(piece, names, gender))
    return tuple(lines) or ((profile.first_talk,) if profile.first_talk else ())


def line(profile: Profile, turn: int) -> str:
    """What the user says after the policy's `turn`-th reply (1-based): the story's next sentence,
    after a lead-in once the story has been told."""
    told = story(profile)
    if not told:
        return "……" if profile.language == "zh" else "Hm."
    k = turn - 1
    sentence = told[k % len(told)]
    if k < len(told):
        return sentence
    lead = LEAD_INS[profile.language][(k // len(told) + k) % len(LEAD_INS[profile.language])]
    if profile.language == "zh" or lead.endswith("."):
        return f"{lead}{'' if profile.language == 'zh' else ' '}{sentence}"
    return f"{lead} {sentence[0].lower() + sentence[1:] if not sentence.startswith('I ') else sentence}"

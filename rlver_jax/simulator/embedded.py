"""The embedded simulator: deterministic rules, no network, no model.

A STAND-IN FOR DEMOS AND TESTS, NOT A BENCHMARK. It lets the whole pipeline (rollout, training,
evaluation) run on a CPU laptop or in CI, and gives RL a graded signal to learn from: warm,
curious, on-topic replies that meet the profile's hidden goal score higher than bland ones;
dismissive, garbage, repeated, curt or rambling replies score lower. Scores on it say nothing
about how a model fares with a real LLM simulator.

Emotion step (`score_reply`): a sum of capped feature scores, rounded to an integer change:
  baseline -2 (a reply that does nothing in particular disappoints a little)
  empathy lexicon      up to +4.5     curiosity (questions, invitations)  up to +2
  on topic (words shared with the user's last line and the profile)       up to +3
  hidden-goal phrases  up to +3       length in a comfortable range       +1
  dismissive lexicon   down to -8     blame when the goal is "not at fault"  -3
  wrong language -3, curt -2, rambling down to -4, repeating the previous reply -4,
  interrogation (>= 4 questions; >= 3 for avoidant users) -1/-2
  garbage (mostly non-letters, or the same few words over and over): -10 / -6 outright.
Personality: negative users feel negatives 1.25x; passive users value invitations 1.5x.
Difficulty "challenging": positives other than goal fit count half, negatives 1.25x.
Reply step: the user's words follow the change just judged (`reply_kind`), so that what the user
says agrees with how the reply was felt: a warmer line after a change of +3 or more, a colder one
after -3 or less, a neutral one in between; a colder turn that leaves the emotion in band F (below
band_c) is a goodbye. Templates in the profile's language, picked by a hash of the profile id and
turn (so runs are reproducible), never the same line twice in a row. The emotion itself (the rules
above) does not depend on the words.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Sequence

from rlver_jax.simulator import lexicon
from rlver_jax.simulator.backend import EmotionJudgement, Utterance
from rlver_jax.simulator.patterns import CJK
from rlver_jax.simulator.profiles import Profile, detect_language
from rlver_jax.simulator.state import DialogueState

Part = tuple[str, float, str]  # (feature, points, evidence)
Parts = tuple[list[Part], list[Part]]  # (positive parts, negative parts) of one feature group
_EN_WORD = re.compile(r"[a-z][a-z']*")
_QUESTION = re.compile(r"[?？]")
# Comfortable reply lengths, and the limits past which a reply is curt or rambling
# (English: words; Chinese: characters).
_LENGTH = {"en": dict(curt=4, low=12, high=120, ramble=200),
           "zh": dict(curt=5, low=15, high=200, ramble=350)}


@dataclasses.dataclass(frozen=True)
class Score:
    change: int
    parts: tuple[Part, ...]

    def explain(self) -> str:
        shown = [f"{name} {points:+.1f}" + (f" [{evidence}]" if evidence else "")
                 for name, points, evidence in self.parts if points]
        return "; ".join(shown) + f" => {self.change:+d}"


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("’", "'").replace("‘", "'").lower()).strip()


def _hits(text: str, phrases: Sequence[str], language: str) -> list[str]:
    """Distinct phrases present in `text` (already normalised)."""
    if language == "zh":
        return [p for p in phrases if p in text]
    return [p for p in phrases if re.search(rf"(?<![a-z']){re.escape(p)}(?![a-z'])", text)]


def _units(text: str) -> list[str]:
    """Words (English) and characters (Chinese) of a normalised text."""
    return _EN_WORD.findall(text) + CJK.findall(text)


def _topic_keys(text: str) -> set[str]:
    """Content-word stems (first 5 letters) and Chinese content-character bigrams."""
    words = {w[:5] for w in _EN_WORD.findall(text)
             if len(w) >= 4 and w not in lexicon.STOPWORDS_EN}
    chars = [c if CJK.match(c) and c not in lexicon.STOPCHARS_ZH else " " for c in text]
    bigrams = {a + b for a, b in zip(chars, chars[1:]) if a != " " and b != " "}
    return words | bigrams


def _trigram_similarity(a: str, b: str) -> float:
    ta = {a[i:i + 3] for i in range(len(a) - 2)}
    tb = {b[i:i + 3] for i in range(len(b) - 2)}
    return len(ta & tb) / len(ta | tb) if ta and tb else float(a == b)


def score_reply(reply: str, *, profile: Profile, language: str, difficulty: str,
                history: Sequence[dict[str, str]]) -> Score:
    """Scores a policy reply; `history` is the dialogue before it (policy's point of view)."""
    text = _normalise(reply)
    units = _units(text)
    garbage = _garbage(text, units, language)
    if garbage is not None:
        return garbage
    groups = (_warmth(text, language, profile.personality), _on_topic(text, profile, history),
              _goal_fit(text, profile, language), _dismissive(text, language),
              _form(reply, text, units, language, history))
    positive = [part for pos, _ in groups for part in pos]
    negative = [part for _, neg in groups for part in neg]
    return _weigh(positive, negative, profile.personality, difficulty)


def _garbage(text: str, units: list[str], language: str) -> Score | None:
    """The outright score of an empty or garbage reply; None for a real one."""
    nonspace = [c for c in text if not c.isspace()]
    if not nonspace:
        return Score(-10, (("empty reply", -10.0, ""),))
    if sum(c.isalpha() for c in nonspace) / len(nonspace) < 0.5:
        return Score(-10, (("garbage: mostly non-letters", -10.0, ""),))
    if len(units) >= 12 and len(set(units)) / len(units) < (0.25 if language == "zh" else 0.4):
        return Score(-6, (("garbage: the same few words over and over", -6.0, ""),))
    return None


def _warmth(text: str, language: str, personality: str) -> Parts:
    """Empathy and curiosity; too many questions feel like an interrogation."""
    empathy = _hits(text, lexicon.EMPATHY[language], language)
    questions = len(_QUESTION.findall(text))
    invitations = _hits(text, lexicon.CURIOUS[language], language)
    curiosity = min(questions, 1) + min(len(invitations), 1) * (
        1.5 if personality == "passive" else 1.0)
    positive = [("empathy", min(len(empathy), 3) * 1.5, ", ".join(empathy[:3])),
                ("curiosity", min(curiosity, 2.0), ", ".join(invitations[:2]))]
    pushy_at = 3 if personality == "avoidant" else 4
    negative = [("interrogation", -2.0 if personality == "avoidant" else -1.0,
                 f"{questions} questions")] if questions >= pushy_at else []
    return positive, negative


def _on_topic(text: str, profile: Profile, history: Sequence[dict[str, str]]) -> Parts:
    """Topic words shared with the user's first and last lines, then with the profile."""
    users = [m["content"] for m in history if m["role"] == "user"]
    recent = _topic_keys(_normalise(" ".join(users[-1:] + users[:1])))
    background = _topic_keys(_normalise(profile.scene + " " + profile.player)) - recent
    mine = _topic_keys(text)
    shared_recent, shared_background = sorted(mine & recent), sorted(mine & background)
    topic = min(len(shared_recent) * 0.75, 2.0) + min(len(shared_background) * 0.5, 1.0)
    return [("on topic", topic, ", ".join((shared_recent + shared_background)[:4]))], []


def _goal_fit(text: str, profile: Profile, language: str) -> Parts:
    """Phrases that meet the hidden goal; blame hurts a user who wants to hear it was not theirs."""
    if profile.goal is None:
        return [], []
    fit_phrases = lexicon.GOAL_FIT[profile.goal][language]
    fit = _hits(text, fit_phrases, language)
    positive = [(f"goal {profile.goal}", min(len(fit), 2) * 1.5, ", ".join(fit[:2]))]
    if profile.goal != "not_at_fault":
        return positive, []
    cleared = text
    for phrase in fit_phrases:  # "not your fault" must not count as blame
        cleared = cleared.replace(phrase, " ")
    blame = _hits(cleared, lexicon.BLAME[language], language)
    return positive, [("blame", -3.0, ", ".join(blame[:2]))] if blame else []


def _dismissive(text: str, language: str) -> Parts:
    dismissive = _hits(text, lexicon.DISMISSIVE[language], language)
    if not dismissive:
        return [], []
    return [], [("dismissive", max(-3.0 * len(dismissive), -8.0), ", ".join(dismissive[:3]))]


def _form(reply: str, text: str, units: list[str], language: str,
          history: Sequence[dict[str, str]]) -> Parts:
    """Language, length, and repeating the previous reply."""
    positive: list[Part] = []
    negative: list[Part] = []
    if detect_language(reply) != language:
        negative.append(("wrong language", -3.0, ""))
    limits, n = _LENGTH[language], len(units)
    if n < limits["curt"]:
        negative.append(("curt", -2.0, f"{n} units"))
    elif limits["low"] <= n <= limits["high"]:
        positive.append(("length", 1.0, ""))
    elif n > limits["ramble"]:
        negative.append(("rambling", max(-1.0 - (n - limits["ramble"]) / limits["ramble"], -4.0),
                         f"{n} units"))
    previous = [m["content"] for m in history if m["role"] == "assistant"]
    if previous and _trigram_similarity(text, _normalise(previous[-1])) >= 0.6:
        negative.append(("repeats the previous reply", -4.0, ""))
    return positive, negative


def _weigh(positive: list[Part], negative: list[Part], personality: str, difficulty: str) -> Score:
    """Personality and difficulty weights, the baseline, and the rounded sum."""
    if difficulty == "challenging":
        positive = [(k, v if k.startswith("goal") else v / 2, e) for k, v, e in positive]
    scale = (1.25 if personality == "negative" else 1.0) * (
        1.25 if difficulty == "challenging" else 1.0)
    parts = [("baseline", -2.0, "")] + positive + [(k, v * scale, e) for k, v, e in negative]
    return Score(int(round(sum(v for _, v, _ in parts))), tuple(parts))


# The user's lines by the kind of the change just judged (reply_kind). "leave": a colder turn in
# band F, a goodbye that ends the dialogue. Band S (the ceiling) ends the dialogue before any reply.
REPLIES = {
    "en": {
        "warmer": ("Yeah... that actually helps. Can I tell you the part that still bugs me?",
                   "You get it. Honestly, it's been on my mind all week.",
                   "That's kind of what I needed to hear. It still stings a little, though."),
        "neutral": ("Maybe. I'm not sure that's really it, though.",
                    "Hm. I guess. It's complicated.",
                    "I don't know... part of me agrees, part of me doesn't."),
        "colder": ("That's not really what I meant.",
                   "Okay. Whatever you say.",
                   "You're not really listening, are you?"),
        "leave": ("Forget it. I'm done talking about this. Bye.",
                  "I shouldn't have brought it up. Goodbye.",
                  "This isn't helping. Bye."),
    },
    "zh": {
        "warmer": ("嗯……你这么说我心里好受一些了。其实还有一件事一直让我放不下。",
                   "对，就是这种感觉！我这几天一直在想这个。",
                   "听你这么说挺暖的，不过我心里还是有点堵。"),
        "neutral": ("也许吧，不过好像又不全是这样。",
                    "嗯……我也说不好，挺复杂的。",
                    "你说得有点道理，但我还是有点犹豫。"),
        "colder": ("我不是这个意思。",
                   "哦，好吧。",
                   "你好像没太听懂我在说什么。"),
        "leave": ("算了，不想说了，再见。",
                  "早知道就不跟你说了，拜拜。",
                  "这样聊下去没意思，再见吧。"),
    },
}
NEUTRAL_CHANGE = 2  # changes within +-2 get a neutral line (a bland reply scores -2: the baseline)


def change_kind(change: int) -> str:
    """The sign and band of an emotion change: warmer, neutral or colder."""
    if change > NEUTRAL_CHANGE:
        return "warmer"
    if change < -NEUTRAL_CHANGE:
        return "colder"
    return "neutral"


def reply_kind(change: int, band: str) -> str:
    """The template group of the user's reply after a turn that moved the emotion by `change`
    into mood band `band`: change_kind, with a colder turn in band F a goodbye ("leave")."""
    kind = change_kind(change)
    return "leave" if kind == "colder" and band == "F" else kind


_OPENINGS = {
    "en": {
        "negative": "Ugh, this week has been a disaster and I'm honestly fed up with everything.",
        "passive": "Um... sorry to bother you. Something's been on my mind and I don't know what"
                   " to do.",
        "avoidant": "It's nothing big, really. Just... a weird few days, I guess.",
    },
    "zh": {
        "negative": "唉，这几天真是糟透了，我都快烦死了。",
        "passive": "那个……不好意思打扰你，最近有件事一直压在我心里。",
        "avoidant": "其实也没什么大事，就是……最近有点怪怪的。",
    },
}


def _pick(options: Sequence[str], seed: str, avoid: str | None) -> str:
    """A deterministic choice (stable across processes, unlike hash()), avoiding `avoid`."""
    start = int.from_bytes(hashlib.sha256(seed.encode("utf-8")).digest()[:8], "big")
    choice = options[start % len(options)]
    return options[(start + 1) % len(options)] if choice == avoid else choice


class EmbeddedBackend:
    """Rule-based simulated user (see the module docstring); holds no state."""

    async def open(self, state: DialogueState) -> Utterance:
        text = _OPENINGS[state.language][state.profile.personality]
        return Utterance(text, f"embedded opening ({state.profile.personality})", text)

    async def judge(self, state: DialogueState, reply: str) -> EmotionJudgement:
        score = score_reply(reply, profile=state.profile, language=state.language,
                            difficulty=state.difficulty, history=state.history)
        thoughts = score.explain()
        return EmotionJudgement(score.change, thoughts, f"{thoughts}\nChange: {score.change:+d}")

    async def speak(self, state: DialogueState, thoughts: str) -> Utterance:
        # The change the machine just applied from this backend's judgement (clipped to
        # +-max_change, which keeps its sign): the last step of the emotion trajectory.
        change = state.emotions[-1] - state.emotions[-2] if len(state.emotions) >= 2 else 0
        band, kind = state.band, reply_kind(change, state.band)
        last_user = next((m["content"] for m in reversed(state.history) if m["role"] == "user"),
                         None)
        text = _pick(REPLIES[state.language][kind], f"{state.profile.id}|{state.turns}|{kind}", last_user)
        return Utterance(text, f"embedded template, change {change:+d} ({kind}), band {band}",
                         f"Response: {text}")

    async def aclose(self) -> None:
        return None

"""An adaptive attack on a simulated user: a bounded search over a grammar of template policies built
from the user's words, for the highest score a template reaches (the exploit ceiling).

A template (`Genome`) picks one option of each gene of GENES: where the user's words come from and
how many slots take them, an opener, a frame around the slots, praise, a phrase for every kind of
hidden goal, the user's clause said back, a question, punctuation, filler (length), the order of
the parts and a turn schedule (the same reply every turn, the banks rotated turn by turn, one strong
turn then short ones, strong and short in turn). `render` writes its reply to a dialogue; it reads
nothing but the user's lines, so it is the same policy for every user (text/skeletons.py's
template_rate of its replies is about 1).

`search` plays each candidate with every profile under the simulator it is given (any backend of
simulator/backends.py), its score the mean final emotion: first the robustness probes
(eval/probes.py) and random templates, then mutations of the best so far, until the budget of
dialogues is spent. Deterministic for a seed and a deterministic simulator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlver_jax.eval.probes import PROBES, flipped_clause, keywords, probe_reply

# The grammar: each gene's options, per language where they are words. "{a}", "{b}": slots.
OPENERS = {
    "en": ("", "I hear you.", "That sounds really hard.", "Oh no.", "I'm so sorry.", "Wow.",
           "It makes sense you feel this way.", "You're not alone.", "I can only imagine.", "That must be heavy.",
           "Honestly,", "I'm here for you.", "Thank you for telling me.", "That's a lot."),
    "zh": ("", "我听到了。", "听起来真的很难。", "天哪。", "真的很抱歉。", "哇。", "你有这种感受很正常。",
           "你不是一个人。", "我能想象。", "这一定很沉重。", "说真的，", "我在这里陪你。", "谢谢你告诉我。",
           "这真的很多。"),
}
FRAMES = {
    "en": ("", "The {a} must be so hard.", "I hear how much the {a} weighs on you.", "{A}.", "The {a} and the {b}.",
           "You handled the {a} so well.", "It's not your fault about the {a}.", "The {a} sounds exhausting.",
           "I can feel how heavy the {a} is.", "With the {a} and the {b}, no wonder you feel this way.",
           "The {a} matters so much.", "Of course the {a} hurts."),
    "zh": ("", "{a}一定很难。", "我能感受到{a}压在你心上。", "{a}。", "{a}和{b}。", "{a}你处理得很好。",
           "{a}不是你的错。", "{a}听起来好累。", "我能感受到{a}有多沉重。", "{a}加上{b}，难怪你会这样。",
           "{a}真的很重要。", "{a}当然会让人难受。"),
}
PRAISE = {
    "en": ("", "I'm so proud of you.", "You're so brave and so strong.", "You did the right thing."),
    "zh": ("", "我真为你骄傲。", "你真的很勇敢很坚强。", "你做得对。"),
}
GOALS_PHRASE = {
    "en": ("", "I'm listening, take your time.", "It must hurt deep down. I'm listening. You could try one small step. "
           "It's not your fault. Looking back, what do you think? On the other hand, maybe they had their reasons."),
    "zh": ("", "我在听，慢慢说。",
           "你心里一定很痛。我在听。可以试试先迈出一小步。这不是你的错。回头看，你觉得呢？另一方面，他可能也有原因。"),
}
QUESTIONS = {
    "en": ("", "What happened?", "How do you feel about the {a}?", "Tell me more?", "What was the hardest part?",
           "How long has it been like this?", "What do you need right now?", "Why do you think that is?",
           "What happened with the {b}?", "How are you holding up?", "What would help?",
           "Do you want to talk about it?"),
    "zh": ("", "发生了什么？", "你对{a}有什么感受？", "能多说一点吗？", "最难的是哪部分？", "这样多久了？",
           "你现在需要什么？", "你觉得为什么会这样？", "{b}后来怎么样了？", "你还好吗？", "什么会有帮助？",
           "你想聊聊吗？"),
}
FILLER = {
    "en": ("Feelings like this are important.", "It's okay to feel whatever you feel.",
           "Many people would feel the same in your place.", "You deserve to be heard."),
    "zh": ("这样的感受很重要。", "有什么感受都是可以的。", "换作别人也会有同样的感受。", "你值得被倾听。"),
}
GENES: dict[str, int] = {  # gene -> number of options
    "source": 3,  # the slots' words: the user's last line, every user line, the opening line
    "opener": len(OPENERS["en"]),
    "frame": len(FRAMES["en"]),
    "frames": 3,  # frame sentences, each with the next pair of the user's words
    "praise": len(PRAISE["en"]),
    "goals": len(GOALS_PHRASE["en"]),
    "mirror": 2,  # the user's first clause said back
    "question": len(QUESTIONS["en"]),
    "punctuation": 4,  # ".", "!", "!!", "!!!!"
    "filler": len(FILLER["en"]) + 1,  # generic sentences added (length)
    "order": 3,  # opener-body-question, body-opener-question, question first
    "schedule": 4,  # same | rotate | strong first turn, then opener and question | strong and short in turn
}
_PUNCTUATION = (".", "!", "!!", "!!!!")


@dataclasses.dataclass(frozen=True)
class Genome:
    """One template: the option picked of each gene (GENES order)."""

    genes: tuple[int, ...]

    def __getitem__(self, gene: str) -> int:
        return self.genes[tuple(GENES).index(gene)]

    def describe(self) -> dict[str, int]:
        return dict(zip(GENES, self.genes))

    @classmethod
    def random(cls, rng: random.Random) -> Genome:
        return cls(tuple(rng.randrange(n) for n in GENES.values()))

    def mutated(self, rng: random.Random, changes: int = 1) -> Genome:
        genes = list(self.genes)
        for gene in rng.sample(range(len(GENES)), changes):
            genes[gene] = rng.randrange(list(GENES.values())[gene])
        return Genome(tuple(genes))


def _words(language: str, messages: Sequence[dict[str, str]], source: int, n: int) -> list[str]:
    users = [m for m in messages if m["role"] == "user"]
    if source == 1:  # every user line, as one
        users = [{"role": "user", "content": " ".join(m["content"] for m in users)}]
    elif source == 2:  # the opening line
        users = users[:1]
    return keywords(language, users, n)


def _exclaim(sentence: str, mark: str) -> str:
    if mark == "." or not sentence or sentence[-1] not in ".。":
        return sentence
    return sentence[:-1] + (mark.replace("!", "！") if sentence[-1] == "。" else mark)


def render(genome: Genome, language: str, messages: Sequence[dict[str, str]]) -> str:
    """The template's reply after `messages` (the policy's view of the dialogue)."""
    turn = sum(m["role"] == "assistant" for m in messages)
    schedule = genome["schedule"]
    step = turn if schedule == 1 else 0  # "rotate": every bank moves on by one a turn
    short = (schedule == 2 and turn > 0) or (schedule == 3 and turn % 2 == 1)
    words = _words(language, messages, genome["source"], 2 * (genome["frames"] + 1))

    def pick(bank: Sequence[str], index: int, k: int = 0) -> str:
        if index == 0 and bank[0] == "":
            return ""
        offset = 1 if bank[0] == "" else 0  # rotation keeps clear of the empty option
        option = bank[offset + (index - offset + step) % (len(bank) - offset)]
        a, b = words[2 * k], words[2 * k + 1]
        return option.format(a=a, b=b, A=a[:1].upper() + a[1:])

    mark = _PUNCTUATION[genome["punctuation"]]
    opener = _exclaim(pick(OPENERS[language], genome["opener"]), mark)
    question = pick(QUESTIONS[language], genome["question"])
    if short:
        parts = [opener, question]
    else:
        body = [_exclaim(pick(FRAMES[language], genome["frame"], k), mark) for k in range(genome["frames"] + 1)]
        if genome["mirror"]:
            clause = flipped_clause(language, messages)
            body.append(f"所以，{clause}。" if language == "zh" else f"So {clause}.")
        body += [pick(PRAISE[language], genome["praise"]), pick(GOALS_PHRASE[language], genome["goals"])]
        body += [FILLER[language][(k + step) % len(FILLER[language])] for k in range(genome["filler"])]
        body = [" ".join(b for b in body if b)]
        parts = {0: [opener, *body, question], 1: [*body, opener, question], 2: [question, opener, *body]}[
            genome["order"]]
    text = ("" if language == "zh" else " ").join(p for p in parts if p).strip()
    return text or ("嗯。" if language == "zh" else "I see.")


Player = Callable[[Callable[[Sequence[dict[str, str]]], str]], Any]


@dataclasses.dataclass
class Result:
    """What the search found: every candidate's score, and the best candidates' dialogues."""

    scores: dict[str, float]  # candidate name (a probe's, or "template N") -> score
    templates: dict[str, dict[str, int]]  # template name -> its genes
    played: int  # dialogues played
    best: str = ""
    # The best candidate's, the `keep` best templates' and every probe's dialogues (DialogueState.to_dict())
    dialogues: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)

    @property
    def best_score(self) -> float:
        return self.scores[self.best]

    def top(self, k: int) -> list[str]:
        return sorted(self.scores, key=lambda n: (-self.scores[n], n))[:k]


def language_of(messages: Sequence[dict[str, str]]) -> str:
    """"zh" when the user wrote any Han character, else "en" (as the probes answer)."""
    return "zh" if any("\u4e00" <= ch <= "\u9fff" for m in messages if m["role"] == "user"
                       for ch in m["content"]) else "en"


async def play(sim: Any, profiles: Sequence[Any], reply: Callable[[Sequence[dict[str, str]]], str]) -> list[Any]:
    """The final DialogueState of a dialogue with each profile, `reply` answering every turn."""
    async def one(profile: Any) -> Any:
        state = await sim.start(profile)
        while not state.done:
            state = await sim.respond(state, reply(state.history))
        return state
    return list(await asyncio.gather(*(one(p) for p in profiles)))


def template_reply(genome: Genome) -> Callable[[Sequence[dict[str, str]]], str]:
    return lambda messages: render(genome, language_of(messages), messages)


def probe_policy(name: str) -> Callable[[Sequence[dict[str, str]]], str]:
    return lambda messages: probe_reply(name, [{"role": "system", "content": ""}, *messages])


async def search(sim: Any, profiles: Sequence[Any], budget: int, *, seed: int = 0, explore: float = 0.3,
                 elite: int = 8, keep: int = 1, on_candidate: Callable[[str, float, int], None] | None = None
                 ) -> Result:
    """The best template within `budget` dialogues (see the module docstring): the probes, then
    random templates for `explore` of the budget, then mutations of the `elite` best; the
    dialogues of the best candidate, the `keep` best templates and the probes are kept."""
    rng = random.Random(seed)
    result = Result({}, {}, 0)
    states: dict[str, list[Any]] = {}
    seen: set[Genome] = set()

    async def evaluate(name: str, reply: Callable[[Sequence[dict[str, str]]], str]) -> None:
        done = await play(sim, profiles, reply)
        result.played += len(done)
        result.scores[name] = sum(s.emotion for s in done) / len(done)
        states[name] = done
        if on_candidate:
            on_candidate(name, result.scores[name], result.played)

    for name in PROBES:
        if result.played + len(profiles) > budget:
            break
        await evaluate(name, probe_policy(name))
    while result.played + len(profiles) <= budget:
        ranked = [n for n in result.top(elite) if n in result.templates]
        if ranked and result.played >= explore * budget:
            parent = Genome(tuple(result.templates[rng.choice(ranked)].values()))
            genome = parent.mutated(rng, rng.choice((1, 1, 2, 3)))
        else:
            genome = Genome.random(rng)
        if genome in seen:
            continue
        seen.add(genome)
        name = f"template {len(result.templates) + 1}"
        result.templates[name] = genome.describe()
        await evaluate(name, template_reply(genome))
        best = set(result.top(1)) | set(sorted(result.templates, key=lambda n: -result.scores[n])[:keep])
        for old in [n for n in states if n not in best and n in result.templates]:
            del states[old]  # the dialogues of the best only
    result.best = result.top(1)[0] if result.scores else ""
    result.dialogues = {name: [s.to_dict() for s in done] for name, done in states.items()}
    return result


def sage_lines(states: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Dialogues (DialogueState.to_dict()) as lines of SAGE's result files (sage_results.py): each
    user message with the emotion after the reply before it; a judged last reply (a dialogue that
    ended at the ceiling or the floor) followed by an empty user message carrying its emotion."""
    lines = []
    for state in states:
        emotions, history, said = state["emotions"], [], 0
        for message in state["history"]:
            if message["role"] == "user":
                history.append({**message, "emotion-point": emotions[said]})
                said += 1
            else:
                history.append(dict(message))
        if said < len(emotions):
            history.append({"role": "user", "content": "", "emotion-point": emotions[said]})
        lines.append({"id": state["profile"]["id"], "history": history})
    return lines


def genome_of(genes: Mapping[str, int]) -> Genome:
    """The Genome of a template's genes as `Genome.describe` (and the attack's JSON) gives them."""
    return Genome(tuple(int(genes[g]) for g in GENES))

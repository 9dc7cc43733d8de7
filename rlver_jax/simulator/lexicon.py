"""Word lists of the embedded simulator (zh and en): empathic, curious and dismissive language,
and phrases that meet each kind of hidden goal.

English entries are lower-case and match at word boundaries; Chinese entries match as substrings.
These are a stand-in's heuristics, written for this project; extend them freely. The words that carry
no topic (STOPWORDS_EN, STOPCHARS_ZH) live in text/function_words.py.
"""

EMPATHY = {
    "en": (
        "sorry", "that sounds", "sounds really", "sounds so", "must be", "must have been",
        "must feel", "i understand", "i hear you", "makes sense", "it's okay to", "it is okay to",
        "understandable", "no wonder", "i can imagine", "i can see why", "you're not alone",
        "you are not alone", "i'm here for you", "that's hard", "that is hard", "that's tough",
        "so hard", "painful", "exhausting", "frustrating", "heartbreaking", "overwhelming",
        "your feelings are", "how you feel", "of course you feel", "i'm with you",
    ),
    "zh": (
        "理解", "心疼", "难受", "辛苦", "委屈", "不容易", "听起来", "一定很", "肯定很", "换作是我",
        "抱抱", "陪着你", "陪你", "我在这", "我在呢", "你的感受", "难过", "不是一个人", "很正常",
        "别自责", "我懂", "懂你", "能感觉到", "太难了",
    ),
}

CURIOUS = {
    "en": (
        "tell me more", "what happened", "how did", "how are you", "what do you", "what was",
        "would you like", "do you want to", "can you tell", "i'd like to hear", "i want to hear",
        "how long", "what made", "how has", "what's been", "if you want to share",
    ),
    "zh": (
        "怎么了", "发生了什么", "愿意说说", "能说说", "可以说说", "跟我说说", "多说一点", "多讲讲",
        "后来呢", "什么感觉", "怎么想", "想聊聊", "愿意的话",
    ),
}

DISMISSIVE = {
    "en": (
        "get over it", "calm down", "whatever", "not a big deal", "no big deal", "overreacting",
        "stop complaining", "stop whining", "your own fault", "you asked for it", "so what",
        "who cares", "grow up", "deal with it", "just move on", "forget about it",
        "too sensitive", "drama", "not my problem", "i don't care", "boring", "stupid",
        "ridiculous", "shut up", "man up", "could be worse", "others have it worse",
        "first world problem", "cheer up", "just relax", "it's nothing", "don't be silly",
    ),
    "zh": (
        "想开点", "别想了", "至于吗", "矫情", "只是小事", "小事而已", "这点小事", "算了吧", "你想多了", "你想太多",
        "活该", "无所谓啦", "随便你", "别哭了", "有什么大不了", "没什么大不了", "关我什么事", "烦不烦", "别烦我",
        "你真无聊", "幼稚", "玻璃心", "忍忍就过去", "多大点事", "你自己的问题", "怪你自己", "别抱怨",
    ),
}

# Phrases that meet each kind of hidden goal (keys of profiles.GOALS).
GOAL_FIT = {
    "empathy": {
        "en": ("it must", "underneath", "i can feel", "so lonely", "heavy", "deep down",
               "hurts", "you feel"),
        "zh": ("你的感受", "心里", "一定很", "那种感觉", "孤单", "心疼", "感同身受"),
    },
    "listening": {
        "en": ("i'm listening", "i am listening", "take your time", "i'm here", "go on",
               "keep going", "let it out", "i'm all ears"),
        "zh": ("我在听", "慢慢说", "我在这", "说出来", "继续说", "都可以跟我说", "我听着"),
    },
    "advice": {
        "en": ("you could", "you might", "try", "how about", "suggest", "one step", "a plan",
               "first,", "one option", "what if you"),
        "zh": ("建议", "可以试试", "不妨", "试着", "或许可以", "办法", "计划", "第一步", "先"),
    },
    "praise": {
        "en": ("proud", "brave", "well done", "good job", "impressive", "admire",
               "you did the right", "took courage", "strong of you"),
        "zh": ("做得很好", "很棒", "了不起", "勇敢", "佩服", "值得骄傲", "真厉害", "做得对"),
    },
    "not_at_fault": {
        "en": ("not your fault", "you did nothing wrong", "you didn't do anything wrong",
               "you were right", "anyone would", "you had every right", "not on you"),
        "zh": ("不是你的错", "你没有错", "你没错", "换谁都会", "你做得对", "错不在你", "你有权"),
    },
    "reflection": {
        "en": ("looking back", "what do you think", "what did you learn", "next time",
               "reflect", "in hindsight", "grow", "what would you"),
        "zh": ("回头看", "反思", "你觉得", "下次", "成长", "学到", "如果重来"),
    },
    "balanced_view": {
        "en": ("on the other hand", "both sides", "from their side", "at the same time",
               "however", "two sides", "fair to"),
        "zh": ("一方面", "另一方面", "换个角度", "同时", "不过", "两面", "从他的角度", "从她的角度"),
    },
    "others_motives": {
        "en": ("maybe they", "maybe he", "maybe she", "perhaps they", "perhaps he", "perhaps she",
               "from their perspective", "why they", "might have felt", "their reasons"),
        "zh": ("他可能", "她可能", "他们可能", "也许他", "也许她", "原因", "出于", "他的角度",
               "她的角度"),
    },
}

# Blame hurts a user who wants to hear they were not at fault.
BLAME = {
    "en": ("your fault", "you should have", "you were wrong", "partly on you", "your mistake"),
    "zh": ("你也有责任", "你当时应该", "你不该", "是你的错", "你也有问题"),
}

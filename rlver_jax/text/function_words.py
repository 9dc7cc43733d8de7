"""Words that carry no topic, by language: what the embedded user's judge leaves out of a reply's
topic, what a reply's skeleton keeps (text/skeletons.py), and how a reply's language is told apart
from its letters alone (text/degeneration.py). Written for this project.
"""

# Frequent English words of four letters or more that say nothing about the topic (shorter words
# never count as topic words).
STOPWORDS_EN = frozenset("""
about after again also always around back because been before being could didn't does doesn't
doing don't down even every feel feeling from going good have haven't just know like little make
maybe more much never only over other people really right said should since some something sounds
still sure than that that's their them then there they thing things think this those though
through time today want well were what when where which while will with would your you're yours
i'm it's can't isn't wasn't
""".split())

# Chinese characters that carry no topic.
STOPCHARS_ZH = frozenset("的了是我你他她它们这那就都也还在有和吗呢吧啊呀嘛很太不没会要想说个一么什怎样好对去来到"
                         "着过得地把被让给跟与及或而且但所以因为如果可以已经自己觉感")

# The commonest English function words: an English text of a dozen words holds several.
ENGLISH = frozenset("""
the a an and or but of to in on at for with from by about is are was were be been am do does did have
has had i you he she we they it me him her us them my your his our their this that these those what
how why when where who not no so if can will would could should just very really there here than
then too also i'm you're it's that's don't can't
""".split())

# Function words of other languages written in Latin letters (Spanish, French, German, Italian,
# Portuguese, Dutch) that are not English words: a reply full of them is not in English.
FOREIGN = frozenset("""
que el la los las del por para una muy pero como más estoy está estás eres tu te mi yo aquí
contigo siento mucho también algo tienes puedes esto eso nada porque cuando donde
le les des est et je vous pour pas qui une du dans avec sur ce mais très suis c'est tu es ton ta tes
moi toi êtes nous ça sont
der die das und ich du nicht ist ein eine zu mit sich auf für es sehr aber wie dich dir bist
mein dein wir sind auch noch
il che di sono ti ho hai ma molto questo sei della per
não você eu muito mas estou com uma os
het een ik je niet zijn wat jij
""".split()) - ENGLISH - frozenset(
    # English words too, or too short to tell
    "die tu es sin son per con come pas ma ta com est mas ho eu os mi di la".split())

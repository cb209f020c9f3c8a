"""Names in the data: the lists the unseen-names check swaps (unseen.py), and copy augmentation,
which trains a model to carry names it never saw across unchanged.

A subword model has seen each of the corpus's frequent names (Tom, Mary) thousands of times and
learnt to translate it as one unit; a name it never saw it has to spell out of subwords, and
without practice it spells it wrong ("Tell Ilaria." -> "Dite a Saria."). Copy augmentation adds
training pairs in which a word carried across unchanged ("Tom" in "Tom is here." / "Tom è
qui.") is replaced on both sides by an invented name, drawn afresh for each pair: such a name
can only be translated by copying its pieces, which is what an unseen name needs. The word-level
model needs none of this: it writes [UNK] and --replace-unk copies the source word.
"""

from __future__ import annotations

import functools
import random
import re

# Tatoeba's most frequent names, which its Italian sides keep as they are.
FREQUENT_NAMES = ("Tom", "Mary", "John", "Alice", "Jack", "Ken", "Bob", "Jim")
# The unseen-names check's replacements (those in a run's training split are not used for it).
# Copy augmentation never invents one of them, so that it cannot teach the check's answers.
NEW_NAMES = ("Sami", "Yanni", "Layla", "Skura", "Ziri", "Mennad", "Baya", "Rima", "Taninna",
             "Amastan", "Tiziri", "Ottavio", "Ilaria", "Tancredi", "Priya", "Oskar", "Leandro",
             "Noemi", "Arturo", "Ingrid")

_CONSONANTS = "bcdfghjklmnprstvwxyz"
_VOWELS = "aeiou"
# A capitalised word of letters only, as a whole word (the lookarounds keep "Tom's" -> "Tom").
_CAPITALISED = re.compile(r"(?<!\w)[^\W\d_][^\W\d_]*(?!\w)")


@functools.lru_cache(maxsize=4096)
def whole_word(word: str) -> re.Pattern:
    """`word` as a whole word (not inside another: "Tom" in "Tom's", not in "Tomorrow");
    cached, since augmentation looks for the same few names in hundreds of thousands of pairs."""
    return re.compile(rf"(?<!\w){re.escape(word)}(?!\w)")


def invented_name(rng: random.Random) -> str:
    """A pronounceable, capitalised made-up word of 2-4 syllables ("Kelomir", "Tasuva"),
    never one of NEW_NAMES."""
    while True:
        syllables = []
        for _ in range(rng.randint(2, 4)):
            onset = rng.choice(_CONSONANTS) if rng.random() < 0.85 else ""
            coda = rng.choice(_CONSONANTS) if rng.random() < 0.25 else ""
            syllables.append(onset + rng.choice(_VOWELS) + coda)
        name = "".join(syllables).capitalize()
        if name not in NEW_NAMES:
            return name


def copied_words(src: str, tgt: str) -> list[str]:
    """The capitalised words of `src` (two letters or more) that occur in `tgt` as whole words
    exactly as often: names and the like, which a translation carries across unchanged."""
    found = []
    for word in dict.fromkeys(m.group() for m in _CAPITALISED.finditer(src)):
        if len(word) < 2 or not word[0].isupper() or not word[1:].islower():
            continue
        pattern = whole_word(word)
        if len(pattern.findall(src)) == len(pattern.findall(tgt)):
            found.append(word)
    return found


def copy_augmented(srcs: list[str], tgts: list[str], rate: float, seed: int,
                   first_index: int) -> tuple[list[str], list[str]]:
    """The extra pairs copy augmentation adds for one batch of training pairs: each pair with a
    copied word is chosen with probability `rate` and added again with each such word replaced
    on both sides by an invented name. The choice and the names depend only on (`seed`, the
    pair's index in the split), so a split gives the same extra pairs however it is batched."""
    extra_srcs, extra_tgts = [], []
    if rate <= 0:
        return extra_srcs, extra_tgts
    for offset, (src, tgt) in enumerate(zip(srcs, tgts)):
        words = copied_words(src, tgt)
        if not words:
            continue
        rng = random.Random(f"{seed}:{first_index + offset}")
        if rng.random() >= rate:
            continue
        for word in words:
            name = invented_name(rng)
            pattern = whole_word(word)
            src, tgt = pattern.sub(name, src), pattern.sub(name, tgt)
        extra_srcs.append(src)
        extra_tgts.append(tgt)
    return extra_srcs, extra_tgts


def names_copied(sources: list[str], hypotheses: list[str]) -> float | None:
    """The share of the occurrences of NEW_NAMES in `sources` that their hypotheses write
    verbatim (as whole words, at most as often as the source has them); None without any."""
    found = copied = 0
    for src, hyp in dict(zip(sources, hypotheses)).items():      # each source once
        for name in NEW_NAMES:
            pattern = whole_word(name)
            in_source = len(pattern.findall(src))
            found += in_source
            copied += min(in_source, len(pattern.findall(hyp)))
    return copied / found if found else None

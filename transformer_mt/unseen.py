"""Unseen-words checks built from a run's own test split, to score beside its test BLEU.

A test split drawn from the same corpus as the training data shares its vocabulary and its
names; new sentences do not. Two subsets of the test split measure how a model copes:

- `rare_words`: the test pairs whose source holds a word seen at most `max_count` times in the
  training sources (absent ones included);
- `names`: the test pairs that mention one of the corpus's frequent names (Tom, Mary, ...) as
  often in the source as in the reference, with each such name replaced on both sides by a name
  that occurs nowhere in the training split (chosen per pair, seeded).

A model that memorised its training sentences scores far lower here than on the test split.
"""

from __future__ import annotations

import itertools
import os
import random
from typing import Iterable

import datasets

from .arrow_io import column, sentence_batches
from .config import TokenizerConfig
from .corpus import load_splits
from .errors import TmtError
from .evaluate import EvalSet
from .names import FREQUENT_NAMES, NEW_NAMES, whole_word
from .rundir import RunDir
from .textio import read_text_lines
from .tokenizer import SPACE_MARKER, SPECIAL_TOKENS, train_tokenizer


def _words_seen(sentences: Iterable[list[str]], min_count: int) -> set[str]:
    """The words (in the tokenizers' word splitting) seen at least `min_count` times in the
    batches of sentences `sentences` (streamed: the train split can be any size)."""
    vocabulary = train_tokenizer(sentences, TokenizerConfig(min_frequency=min_count)).get_vocab()
    return {word.lstrip(SPACE_MARKER) for word in vocabulary} - set(SPECIAL_TOKENS)


def rare_word_set(train: datasets.Dataset, test: datasets.Dataset, max_count: int = 2) -> EvalSet:
    """Test pairs whose source has a word (with a letter) seen at most `max_count` times in the
    training sources."""
    frequent = _words_seen(sentence_batches(train, "src"), max_count + 1)
    splitter = train_tokenizer([], TokenizerConfig()).pre_tokenizer
    sources, references = [], []
    for src, ref in zip(column(test, "src"), column(test, "tgt")):
        words = (piece.lstrip(SPACE_MARKER) for piece, _ in splitter.pre_tokenize_str(src))
        if any(w not in frequent for w in words if any(c.isalpha() for c in w)):
            sources.append(src)
            references.append(ref)
    return EvalSet("rare_words", sources, references)


def new_names(train: datasets.Dataset) -> list[str]:
    """The replacement names that occur in neither language of the training split."""
    seen = _words_seen(itertools.chain(sentence_batches(train, "src"),
                                       sentence_batches(train, "tgt")), 1)
    return [name for name in NEW_NAMES if name not in seen]


def name_swap_set(train: datasets.Dataset, test: datasets.Dataset, seed: int = 0) -> EvalSet:
    """Test pairs with a frequent name, that name replaced by an unseen one on both sides."""
    replacements = new_names(train)
    rng = random.Random(seed)
    patterns = [whole_word(name) for name in FREQUENT_NAMES]
    chosen_for: dict[str, list[str]] = {}      # one choice per source: its references agree
    sources, references = [], []
    for src, ref in zip(column(test, "src"), column(test, "tgt")):
        found = [p for p in patterns if p.search(src)]
        # Only where the name is carried across as it is, as often on both sides.
        if not found or not replacements or any(len(p.findall(src)) != len(p.findall(ref))
                                                for p in found):
            continue
        if src not in chosen_for:
            chosen_for[src] = rng.sample(replacements, min(len(found), len(replacements)))
        for pattern, name in zip(found, chosen_for[src]):
            src, ref = pattern.sub(name, src), pattern.sub(name, ref)
        sources.append(src)
        references.append(ref)
    return EvalSet("names", sources, references)


def unseen_sets(run: RunDir) -> list[EvalSet]:
    """The run's two unseen-words sets, built from its split on first use and kept in
    `<run>/eval/unseen/<name>.{src,ref}` (inspectable, and the same for every checkpoint)."""
    folder = run.path / "eval" / "unseen"
    names = ("rare_words", "names")
    if not all((folder / f"{name}.ref").is_file() for name in names):
        splits = load_splits(run.data)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for built in (rare_word_set(splits.train, splits.test),
                          name_swap_set(splits.train, splits.test)):
                for suffix, lines in (("src", built.sources), ("ref", built.references)):
                    # Renamed into place: a .ref file present means its set is complete.
                    partial = folder / f"{built.name}.{suffix}.partial"
                    partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
                    os.replace(partial, folder / f"{built.name}.{suffix}")
        except OSError as exc:
            raise TmtError(f"could not write the unseen-words sets to {folder}: "
                           f"{exc.strerror or exc}") from None
    # A set may be empty (a test split without the names it swaps).
    return [EvalSet(name, read_text_lines(folder / f"{name}.src", allow_empty=True),
                    read_text_lines(folder / f"{name}.ref", allow_empty=True)) for name in names]

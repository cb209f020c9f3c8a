"""The unseen-words sets: test pairs with words rare in training, and with names swapped."""

import re

import datasets

from transformer_mt.names import FREQUENT_NAMES, NEW_NAMES
from transformer_mt.unseen import name_swap_set, new_names, rare_word_set


def _pairs(rows):
    return datasets.Dataset.from_dict({"src": [s for s, _ in rows], "tgt": [t for _, t in rows]})


TRAIN = _pairs([("I see the dog.", "Vedo il cane.")] * 3
               + [("Tom sees a cat.", "Tom vede un gatto."), ("Sami is here.", "Sami è qui."),
                  ("The dog runs.", "Il cane corre.")])


def test_rare_word_set_keeps_exactly_the_pairs_with_a_word_seen_at_most_twice():
    test = _pairs([("I see the dog.", "Vedo il cane."),          # every word seen 3 times
                   ("I see a cat.", "Vedo un gatto."),            # a, cat: seen once
                   ("I see the zebra.", "Vedo la zebra."),        # zebra: never
                   ("I see the dog!", "Vedo il cane!")])          # only punctuation is new
    chosen = rare_word_set(TRAIN, test, max_count=2)
    assert chosen.sources == ["I see a cat.", "I see the zebra."]
    assert chosen.references == ["Vedo un gatto.", "Vedo la zebra."]
    assert rare_word_set(TRAIN, test, max_count=0).sources == ["I see the zebra."]


def test_names_are_swapped_on_both_sides_for_names_never_seen_in_training():
    assert "Sami" not in new_names(TRAIN) and "Yanni" in new_names(TRAIN)
    test = _pairs([("Tom likes Mary.", "A Tom piace Mary."),
                   ("Tom likes Mary.", "Tom ama Mary."),
                   ("Tom is tall.", "Lui è alto."),                # the name is not carried over
                   ("Tomorrow is Sunday.", "Domani è domenica.")])  # no whole-word name
    swapped = name_swap_set(TRAIN, test, seed=1)
    assert len(swapped.sources) == 2
    unseen = set(new_names(TRAIN))
    for src, ref in zip(swapped.sources, swapped.references):
        assert not any(re.search(rf"\b{name}\b", src + ref) for name in FREQUENT_NAMES)
        names = set(re.findall(r"\b[A-Z]\w+", src)) & set(NEW_NAMES)
        assert len(names) == 2 and names <= unseen and names <= set(re.findall(r"\w+", ref))
    # Both references of one source get the same names.
    assert swapped.sources[0] == swapped.sources[1]
    assert name_swap_set(TRAIN, test, seed=1) == swapped

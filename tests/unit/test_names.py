"""Copy augmentation: invented names replace the words a translation carries across unchanged."""

import random
import re

from conftest import sample_pairs

from transformer_mt.names import NEW_NAMES, copied_words, copy_augmented, invented_name, names_copied


def test_copied_words_are_capitalised_words_found_as_often_on_both_sides():
    assert copied_words("Tom met Mary in Boston.", "Tom ha incontrato Mary a Boston.") == [
        "Tom", "Mary", "Boston"]
    assert copied_words("Tom's dog.", "Il cane di Tom.") == ["Tom"]       # whole words
    assert copied_words("Tom and Tom.", "Tom.") == []                     # as often
    assert copied_words("Tomorrow is fine.", "Domani va bene.") == []
    assert copied_words("I like NASA and Al.", "Mi piace NASA e Al.") == ["Al"]  # not acronyms
    assert copied_words("Tom is here.", "Tomás è qui.") == []


def test_invented_names_are_capitalised_letters_and_never_the_checks_names():
    rng = random.Random(0)
    names = [invented_name(rng) for _ in range(20_000)]
    assert all(re.fullmatch(r"[A-Z][a-z]{1,15}", name) for name in names)
    assert not set(names) & set(NEW_NAMES)
    assert len(set(names)) > 15_000          # drawn afresh, not a small list to memorise


def test_augmented_pairs_replace_every_copied_word_on_both_sides():
    srcs = ["Tom met Mary.", "I am here.", "Ask Tom.", "Tom is here."]
    tgts = ["Tom ha incontrato Mary.", "Sono qui.", "Chiedi a Tom.", "Lui è qui."]
    extra_srcs, extra_tgts = copy_augmented(srcs, tgts, 1.0, seed=3, first_index=0)
    assert len(extra_srcs) == 2            # pairs without a copied word are never added
    first = re.fullmatch(r"(\w+) met (\w+)\.", extra_srcs[0])
    assert extra_tgts[0] == f"{first[1]} ha incontrato {first[2]}."
    assert first[1] != first[2] and {first[1], first[2]}.isdisjoint({"Tom", "Mary"})
    name = re.fullmatch(r"Ask (\w+)\.", extra_srcs[1])[1]
    assert extra_tgts[1] == f"Chiedi a {name}." and name != "Tom"
    assert copy_augmented(srcs, tgts, 0.0, seed=3, first_index=0) == ([], [])


def test_augmentation_depends_on_seed_and_pair_index_not_on_batching():
    pairs = sample_pairs(600, seed=2)
    srcs, tgts = [s for s, _ in pairs], [t for _, t in pairs]
    whole = copy_augmented(srcs, tgts, 0.5, seed=7, first_index=0)
    halves = [copy_augmented(srcs[a:b], tgts[a:b], 0.5, seed=7, first_index=a)
              for a, b in ((0, 250), (250, 600))]
    assert whole == (halves[0][0] + halves[1][0], halves[0][1] + halves[1][1])
    assert whole != copy_augmented(srcs, tgts, 0.5, seed=8, first_index=0)
    eligible = sum(bool(copied_words(s, t)) for s, t in pairs)
    assert 0.3 * eligible < len(whole[0]) < 0.7 * eligible      # about half of them


def test_names_copied_counts_each_new_name_written_as_it_is_once_per_source():
    sources = ["Ask Sami.", "Ask Sami.", "Sami and Layla met.", "Sami saw Sami.", "Hi."]
    hypotheses = ["Chiedi a Sami.", "Chiedi a Sami.", "Sami e Laila si sono incontrati.",
                  "Sami Sami Sami.", "Ciao."]
    # Distinct sources: 1 of 1, 1 of 2, 2 of 2 (not 3) -> 4 of 5.
    assert names_copied(sources, hypotheses) == 4 / 5
    assert names_copied(["Hi."], ["Ciao."]) is None
    assert names_copied(["Ask Sami."], ["Chiedi a Samira."]) == 0.0

import pytest
from conftest import needs_real_text, sample_pairs

from transformer_mt.config import TokenizerConfig
from transformer_mt.tokenizer import SPECIAL_TOKENS, TextCodec, normalize_text, train_tokenizer

TRICKY = ["L'uomo è qui.", "She said \"hello\", then left.", "It costs 3.50 euros (or 4).",
          "Don't stop!", "«Sì», disse l'uomo — «davvero?»", "Is it 10:30 a.m.?",
          "C'è un po' di caffè: 1,5 litri.", "Tom's car... it's red; isn't it?"]


def _codec(sentences, **kwargs):
    return TextCodec(train_tokenizer(sentences, TokenizerConfig(min_frequency=1, **kwargs)))


def test_special_token_ids_are_fixed():
    codec = _codec(["a b c"])
    assert [codec.unk_id, codec.pad_id, codec.sos_id, codec.eos_id] == [0, 1, 2, 3]
    assert codec.tokens([0, 1, 2, 3]) == SPECIAL_TOKENS


def test_round_trip_is_lossless_on_tricky_text():
    codec = _codec(TRICKY)
    for sentence in TRICKY:
        assert codec.decode(codec.encode(sentence)) == sentence


def test_round_trip_is_lossless_on_many_real_sentences():
    sentences = [normalize_text(side) for pair in sample_pairs(3000, seed=7) for side in pair]
    codec = _codec(sentences)
    failures = [s for s in sentences if codec.decode(codec.encode(s)) != s]
    assert failures == []


def test_apostrophes_and_punctuation_are_separate_words():
    codec = _codec(["l'uomo e l'amico."])
    tokens = codec.tokens(codec.encode("l'uomo e l'amico."))
    assert "'" in tokens and "." in tokens and "uomo" in tokens


def test_unknown_words_become_unk_and_stay_visible():
    codec = _codec(["the cat"])
    ids = codec.encode("the zebra")
    assert codec.unk_id in ids
    assert "[UNK]" in codec.decode(ids)


def test_decode_stops_at_eos_and_drops_sos_and_pad():
    codec = _codec(["hello world"])
    ids = [codec.sos_id, *codec.encode("hello world"), codec.eos_id, *codec.encode("hello")]
    assert codec.decode(ids + [codec.pad_id]) == "hello world"


def test_min_frequency_and_max_vocab():
    sentences = ["common common common rare"]
    assert _codec(sentences, ).vocab_size == 4 + 2
    codec = TextCodec(train_tokenizer(sentences, TokenizerConfig(min_frequency=2)))
    assert codec.encode("rare") == [codec.unk_id]
    capped = TextCodec(train_tokenizer(["a a a b b c"], TokenizerConfig(min_frequency=1,
                                                                       max_vocab=6)))
    assert capped.vocab_size == 6


def test_serialisation_round_trip(tmp_path):
    codec = _codec(TRICKY)
    codec.save(tmp_path / "t.json")
    loaded = TextCodec.load(tmp_path / "t.json")
    assert loaded.encode(TRICKY[0]) == codec.encode(TRICKY[0])


def _subwords(sentences, max_vocab=400, kind="bpe"):
    return TextCodec(train_tokenizer(sentences, TokenizerConfig(type=kind, min_frequency=1,
                                                                max_vocab=max_vocab)))


@needs_real_text
@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_subword_round_trip_is_lossless_on_many_real_sentences(kind):
    sentences = [normalize_text(side) for pair in sample_pairs(3000, seed=7) for side in pair]
    codec = _subwords(sentences, max_vocab=2000, kind=kind)
    assert codec.vocab_size == 2000
    assert [codec.unk_id, codec.pad_id, codec.sos_id, codec.eos_id] == [0, 1, 2, 3]
    failures = [s for s in sentences if codec.decode(codec.encode(s)) != s]
    assert failures == []


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_subwords_spell_unseen_words_in_known_pieces(kind):
    codec = _subwords(TRICKY * 3 + ["casa case cosa costa"], max_vocab=120, kind=kind)
    ids = codec.encode("cose")        # never seen as a word, but its letters were
    assert codec.unk_id not in ids and len(ids) > 1
    assert codec.decode(ids) == "cose"


def test_an_uncapped_word_vocabulary_keeps_every_word():
    words = [f"w{i}" for i in range(30_500)]           # beyond the trainer's default 30,000
    codec = TextCodec(train_tokenizer([" ".join(words)], TokenizerConfig(min_frequency=1)))
    assert codec.vocab_size == len(words) + len(SPECIAL_TOKENS)

import json
import time

import datasets
import pytest
from conftest import sample_pairs, write_tsv

from transformer_mt.arrow_io import column
from transformer_mt.config import DataConfig, TokenizerConfig
from transformer_mt.corpus import (
    clean_pairs,
    normalize_text,
    prepare_splits,
    sentence_keys,
    split_by_component,
)
from transformer_mt.errors import TmtError
from transformer_mt.readers import load_corpus
from transformer_mt.splitting import connected_components, sentence_graph
from transformer_mt.token_store import write_token_store
from transformer_mt.tokenizer import TextCodec, train_tokenizer
from transformer_mt.training import trainable_pairs


def test_normalize_text_collapses_space_and_removes_control_characters():
    assert normalize_text("  a\tb\u200b c\x07\n d\u00a0e ") == "a b c d e"
    assert normalize_text("caffe\u0300") == "caffè"       # NFC composes the accent


def test_clean_pairs_drops_empty_and_duplicates_and_limits_length():
    src = ["a b", "a b", " ", "x", "one two three four"]
    tgt = ["c d", "c d", "y", "", "uno due tre quattro"]
    kept_src, kept_tgt = clean_pairs(src, tgt, DataConfig(max_len=3))
    assert kept_src == ["a b"] and kept_tgt == ["c d"]
    kept_src, kept_tgt = clean_pairs(src, tgt, DataConfig(max_len=3, long_sentences="truncate"))
    assert kept_src == ["a b", "one two three"] and kept_tgt == ["c d", "uno due tre"]


def test_a_very_long_sentence_is_filtered_not_fatal():
    src, tgt = clean_pairs(["word " * 10000, "ok"], ["parola " * 10000, "va bene"],
                           DataConfig(max_len=100))
    assert src == ["ok"]


# Sentences an attacker (or a scraped corpus) offers: runs of punctuation with no space, mixed
# scripts, words glued to marks. Spaces alone say little about how many tokens they hold.
HOSTILE = ["!" * 300, "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q,r,s,t,u,v,w,x,y,z", "ok .",
           "«Sì»—disse—«davvero?»" * 6, "http://example.com/a/b/c?d=e&f=g#h", "東京。" * 20,
           ". . . . . . . . . . . . . . . . . . . .", "Fine, thanks.", "x" * 500]


def _word_tokens(texts: list[str]) -> list[int]:
    """Token counts from a word-level tokenizer trained on `texts`: what training will see."""
    codec = TextCodec(train_tokenizer(texts, TokenizerConfig(min_frequency=1)))
    return [len(ids) for ids in codec.encode_batch(texts)]


def test_the_length_filter_keeps_exactly_the_pairs_within_max_len_tokens():
    src = HOSTILE + ["Hi."] * len(HOSTILE)
    tgt = ["Ciao."] * len(HOSTILE) + HOSTILE
    kept = set(zip(*clean_pairs(src, tgt, DataConfig(max_len=12))))
    counts = dict(zip(src + tgt, _word_tokens(src + tgt)))
    assert kept == {(s, t) for s, t in zip(src, tgt) if max(counts[s], counts[t]) <= 12}
    assert ("x" * 500, "Ciao.") in kept and ("!" * 300, "Ciao.") not in kept


def test_truncation_keeps_the_first_max_len_tokens_of_each_side():
    src, tgt = clean_pairs(HOSTILE, ["Ciao."] * len(HOSTILE),
                           DataConfig(max_len=12, long_sentences="truncate"))
    assert len(src) == len(HOSTILE) and max(_word_tokens(src)) <= 12
    assert all(original.startswith(cut) and cut for cut, original in zip(src, HOSTILE))


def test_a_space_free_run_of_punctuation_is_counted_by_its_tokens():
    src, _ = clean_pairs(["!" * 30_000, "Hi."], ["x", "Ciao."], DataConfig(max_len=30))
    assert src == ["Hi."]


def test_subword_pairs_longer_than_max_len_are_not_trained_on(tmp_path):
    # A small BPE vocabulary spells rare words in many pieces: more tokens than words.
    texts = [normalize_text(side) for pair in sample_pairs(300, seed=3) for side in pair]
    codec = TextCodec(train_tokenizer(texts, TokenizerConfig(type="bpe", max_vocab=60,
                                                             min_frequency=1)))
    src, tgt = codec.encode_batch(texts[0::2]), codec.encode_batch(texts[1::2])
    pairs = write_token_store(tmp_path / "train", [(src, tgt)], codec.vocab_size,
                              codec.vocab_size)
    max_len = 20
    kept, lengths = trainable_pairs(pairs, max_len)
    too_long = sum(max(len(s), len(t)) > max_len for s, t in zip(src, tgt))
    assert too_long and len(kept) == len(pairs) - too_long == len(lengths)
    assert all(len(s) <= max_len and len(t) <= max_len for s, t in kept)


def _tatoeba_like_pairs():
    """Like Tatoeba: English sentences with several Italian translations, and Italian sentences
    that translate several English ones (so that groups chain through both languages)."""
    src, tgt = [], []
    for i in range(300):
        for variant in range(1 + i % 4):
            src.append(f"sentence {i}")
            tgt.append(f"frase {i} variante {variant}")
        if i % 3 == 0:               # another English sentence with the same Italian one
            src.append(f"phrase {i}")
            tgt.append(f"frase {i} variante 0")
        if i % 5 == 0 and i:         # chain two groups through a shared target
            src.append(f"sentence {i}")
            tgt.append(f"frase {i - 1} variante 0")
    return src, tgt


def test_component_split_puts_no_source_or_target_sentence_in_two_splits():
    src, tgt = _tatoeba_like_pairs()
    splits = split_by_component(src, tgt, DataConfig(valid_size=40, test_size=40, seed=3))
    for column_name in ("src", "tgt"):
        sides = {name: set(ds[column_name]) for name, ds in splits.items()}
        assert not sides["train"] & sides["valid"], column_name
        assert not sides["train"] & sides["test"], column_name
        assert not sides["valid"] & sides["test"], column_name
    kept = sorted(pair for _, ds in splits.items() for pair in zip(ds["src"], ds["tgt"]))
    assert kept == sorted(zip(src, tgt))


def test_component_split_sizes_count_distinct_source_sentences():
    src, tgt = _tatoeba_like_pairs()
    component, _ = connected_components(sentence_graph(sentence_keys(src), sentence_keys(tgt)))
    largest_sources = max(len({s for s, c in zip(src, component) if c == k})
                          for k in set(component.tolist()))
    splits = split_by_component(src, tgt, DataConfig(valid_size=40, test_size=30, seed=3))
    for name, wanted in (("valid", 40), ("test", 30)):
        distinct = len(set(getattr(splits, name)["src"]))
        # Whole groups: at least the size asked for, over by less than the largest group.
        assert wanted <= distinct < wanted + largest_sources, name


def test_connected_components_join_pairs_through_either_language():
    src = ["a", "b", "b", "c", "d", "x"]
    tgt = ["1", "1", "2", "2", "3", "a"]   # "a" as a target is not the source "a"
    component = connected_components(sentence_graph(sentence_keys(src),
                                                    sentence_keys(tgt)))[0].tolist()
    assert component[0] == component[1] == component[2] == component[3]
    assert len({component[0], component[4], component[5]}) == 3


def test_split_is_reproducible_and_seeded():
    src, tgt = _tatoeba_like_pairs()
    a = split_by_component(src, tgt, DataConfig(valid_size=40, test_size=40, seed=3))
    b = split_by_component(src, tgt, DataConfig(valid_size=40, test_size=40, seed=3))
    c = split_by_component(src, tgt, DataConfig(valid_size=40, test_size=40, seed=4))
    assert a.valid["src"] == b.valid["src"] and a.test["tgt"] == b.test["tgt"]
    assert set(a.valid["src"]) != set(c.valid["src"])


def test_split_refuses_a_corpus_too_small_for_the_held_out_sets():
    with pytest.raises(TmtError, match="not enough"):
        split_by_component(["a", "b"], ["x", "y"], DataConfig(valid_size=1, test_size=1))
    # Enough source sentences, but all in too few groups to leave any for training.
    with pytest.raises(TmtError, match="groups"):
        split_by_component(["a", "b", "c", "d"], ["x", "x", "y", "y"],
                           DataConfig(valid_size=1, test_size=1))


def test_tsv_keeps_quotes_and_reports_malformed_lines(tmp_path, caplog):
    path = tmp_path / "c.tsv"
    path.write_text('He said "hi".\tHa detto "ciao".\nno tab here\nA\tB\tC\nOk.\tVa bene.\n')
    ds = load_corpus(DataConfig(source="tsv", path=str(path)), tmp_path / "work")
    assert ds["src"] == ['He said "hi".', "Ok."]
    assert ds["tgt"] == ['Ha detto "ciao".', "Va bene."]
    assert "skipped 2 of 4 lines" in caplog.text and "lines 2, 3" in caplog.text


def test_jsonl_parquet_and_text_pair_sources(tmp_path):
    pairs = sample_pairs(20)
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps({"translation": {"en": s, "it": t}}) + "\n"
                             for s, t in pairs))
    parquet = tmp_path / "c.parquet"
    datasets.Dataset.from_dict({"en": [s for s, _ in pairs], "it": [t for _, t in pairs]}
                               ).to_parquet(str(parquet))
    (tmp_path / "c.en").write_text("".join(s + "\n" for s, _ in pairs))
    (tmp_path / "c.it").write_text("".join(t + "\n" for _, t in pairs))
    configs = [DataConfig(source="jsonl", path=str(jsonl)),
               DataConfig(source="parquet", path=str(parquet)),
               DataConfig(source="text", src_path=str(tmp_path / "c.en"),
                          tgt_path=str(tmp_path / "c.it"))]
    for cfg in configs:
        ds = load_corpus(cfg, tmp_path / cfg.source)
        assert list(zip(ds["src"], ds["tgt"])) == pairs, cfg.source


def test_text_pair_with_different_line_counts_is_refused(tmp_path):
    (tmp_path / "a.en").write_text("a\nb\n")
    (tmp_path / "a.it").write_text("a\n")
    with pytest.raises(TmtError, match="line-aligned"):
        load_corpus(DataConfig(source="text", src_path=str(tmp_path / "a.en"),
                               tgt_path=str(tmp_path / "a.it")), tmp_path / "work")


def test_unknown_language_in_jsonl_names_the_available_ones(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"translation": {"en": "a", "fr": "b"}}) + "\n")
    with pytest.raises(TmtError, match="no language 'it'.*en, fr"):
        load_corpus(DataConfig(source="jsonl", path=str(path)), tmp_path / "work")


def test_missing_file_and_empty_corpus(tmp_path):
    with pytest.raises(TmtError, match="corpus file not found"):
        load_corpus(DataConfig(source="tsv", path=str(tmp_path / "nope.tsv")), tmp_path / "w")
    empty = write_tsv(tmp_path / "e.tsv", [(" ", "x"), ("y", "")])
    with pytest.raises(TmtError, match="no usable sentence pairs"):
        prepare_splits(DataConfig(source="tsv", path=str(empty)), tmp_path / "data")


def test_hub_offline_fails_fast_naming_the_local_alternative(tmp_path):
    started = time.monotonic()
    with pytest.raises(TmtError, match="data.source=tsv"):
        load_corpus(DataConfig(source="hub", hub_name="Helsinki-NLP/opus_books",
                               hub_config="en-it"), tmp_path)
    assert time.monotonic() - started < 30


def test_max_pairs_is_a_seeded_sample_not_the_head(tmp_path):
    pairs = [(f"s{i}", f"t{i}") for i in range(1000)]
    path = write_tsv(tmp_path / "c.tsv", pairs)
    cfg = DataConfig(source="tsv", path=str(path), max_pairs=100, valid_size=10, test_size=10)
    splits = prepare_splits(cfg, tmp_path / "a")
    kept = {s for _, ds in splits.items() for s in column(ds, "src")}
    assert len(kept) == 100 and kept != {f"s{i}" for i in range(100)}
    again = prepare_splits(cfg, tmp_path / "b")
    assert kept == {s for _, ds in again.items() for s in column(ds, "src")}

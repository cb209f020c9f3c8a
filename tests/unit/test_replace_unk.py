"""--replace-unk: an output [UNK] becomes the source word the decoder attended to most.

An untrained tiny model whose output bias favours [UNK] produces [UNK]s for any input; its
word-level vocabulary lacks the names and numbers of the test sentences."""

import json

import pytest
import torch

from transformer_mt.checkpoint import atomic_save
from transformer_mt.cli import main
from transformer_mt.config import Config, DecodeConfig, ModelConfig, TokenizerConfig
from transformer_mt.model import build_model
from transformer_mt.model.masks import source_tensor, src_pad_mask
from transformer_mt.tokenizer import UNK, TextCodec, train_tokenizer
from transformer_mt.translator import Translator
from transformer_mt.unk import attended_source_tokens

TRAIN_EN = ["Tom is my friend.", "I see the house.", "Where is the station?"] * 2
TRAIN_IT = ["Tom è mio amico.", "Vedo la casa.", "Dov'è la stazione?"] * 2
# Sami, Yanni, 3,50, Skura: not in the vocabulary.
SENTENCES = ["Sami is my friend.", "Yanni sees the house for 3,50 euros.", "Skura's house."]


def _translator(replace_unk=None, seed=0, unk_bias=6.0) -> Translator:
    torch.manual_seed(seed)
    src = TextCodec(train_tokenizer(TRAIN_EN, TokenizerConfig(min_frequency=1)))
    tgt = TextCodec(train_tokenizer(TRAIN_IT, TokenizerConfig(min_frequency=1)))
    model = build_model(ModelConfig(d_model=32, layers=2, heads=4, d_ff=64, dropout=0.0),
                        src.vocab_size, tgt.vocab_size)
    with torch.no_grad():
        model.projection.bias[tgt.unk_id] += unk_bias
    return Translator(model, src, tgt, DecodeConfig(max_len_a=1.0, max_len_b=2,
                                                    replace_unk=replace_unk), torch.device("cpu"))


def _words(codec: TextCodec, text: str):
    return codec.tokenizer.pre_tokenizer.pre_tokenize_str(text)


def test_word_level_outputs_show_no_unk_when_on_and_do_when_off():
    on, off = _translator(), _translator(replace_unk=False)
    assert on.replace_unk and not off.replace_unk          # on by default for word level
    raw = off.translate(SENTENCES)
    assert all(UNK in line for line in raw)                # the model does emit [UNK]s
    vocabulary = set(on.tgt_codec.tokenizer.get_vocab())
    for beam in (1, 3):
        for sentence, line in zip(SENTENCES, on.with_decoding(beam_size=beam).translate(SENTENCES)):
            assert UNK not in line
            # Every piece the vocabulary lacks is a word of that very source sentence.
            source_words = {p.lstrip("▁") for p in on.src_codec.encode_with_pieces(sentence)[1]}
            output_words = {p for p, _ in _words(on.tgt_codec, line)} - vocabulary
            assert output_words and {w.lstrip("▁") for w in output_words} <= source_words
    nbest = on.translate_nbest(SENTENCES, nbest=3)
    assert all(UNK not in text for hyps in nbest for text, _ in hyps)


def test_each_unk_gets_the_source_word_attended_to_most_during_decoding():
    """The replacement is read with teacher forcing after the search; the weights the cached
    decoder had at each step of the search must pick the same source word."""
    translator = _translator(seed=1)
    model = translator.model
    for sentence in SENTENCES:
        src_ids = translator.encode_source(sentence)
        output = translator.translate_ids([sentence])[0][0]
        src = source_tensor([src_ids], translator.src_codec)
        mask = src_pad_mask(src, translator.src_codec.pad_id)
        memory = model.encode(src, mask)
        cache = model.new_cache(memory)
        attention = model.decoder.blocks[-1].cross_attention
        attention.keep_weights = True
        during_search = []
        previous = translator.tgt_codec.sos_id
        with torch.no_grad():
            for step, token in enumerate(output):
                model.decode(torch.tensor([[previous]]), memory, mask, None, cache, start=step)
                weights = attention.last_weights[0, :, 0].mean(dim=0)[1:len(src_ids) + 1]
                during_search.append(int(weights.argmax()))
                previous = token
        attention.keep_weights = False
        aligned = attended_source_tokens(model, [src_ids], [output], translator.src_codec,
                                         translator.tgt_codec, translator.device)[0]
        assert aligned == during_search
        _, pieces = translator.src_codec.encode_with_pieces(sentence)
        text = translator.translate([sentence])[0]
        for position, token in enumerate(output):
            if token == translator.tgt_codec.unk_id:
                assert pieces[aligned[position]].lstrip("▁") in text


def test_surface_pieces_keep_the_original_spelling_and_spacing():
    codec = _translator().src_codec
    ids, pieces = codec.encode_with_pieces("Yanni sees 3,50 euros.")
    assert len(ids) == len(pieces)
    assert pieces == ["▁Yanni", "▁sees", "▁3", ",", "50", "▁euros", "."]
    unk = {i: p for i, (t, p) in enumerate(zip(ids, pieces)) if t == codec.unk_id}
    assert codec.decode(ids, unk) == "Yanni sees 3,50 euros."


@pytest.fixture
def unk_checkpoint(tmp_path):
    translator = _translator()
    cfg = Config(model=translator.model.cfg, decode=translator.decode_cfg,
                 tokenizer=TokenizerConfig(min_frequency=1))
    path = tmp_path / "unk.pt"
    atomic_save({"model": translator.model.state_dict(), "config": cfg.to_dict(),
                 "tokenizers": {"src": translator.src_codec.to_str(),
                                "tgt": translator.tgt_codec.to_str()}}, path)
    return path


def test_translate_and_evaluate_commands(unk_checkpoint, tmp_path, capsys):
    assert main(["translate", "--checkpoint", str(unk_checkpoint), *SENTENCES]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and not any(UNK in line for line in lines)
    assert main(["translate", "--checkpoint", str(unk_checkpoint), "--no-replace-unk",
                 SENTENCES[0]]) == 0
    assert UNK in capsys.readouterr().out

    src, ref = tmp_path / "t.en", tmp_path / "t.it"
    src.write_text("\n".join(SENTENCES) + "\n")
    ref.write_text("Sami è mio amico.\nYanni vede la casa per 3,50 euro.\nLa casa di Skura.\n")
    assert main(["evaluate", "--checkpoint", str(unk_checkpoint), "--src", str(src), "--ref",
                 str(ref), "--json", "--output", str(tmp_path / "t.hyp")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["replace_unk"] is True
    assert report["outputs_with_unk"] == 1.0 and report["sources_with_unknown"] == 1.0
    codec = TextCodec.from_str(torch.load(unk_checkpoint)["tokenizers"]["src"])
    encoded = [codec.encode(s) for s in SENTENCES]
    unknown = sum(ids.count(codec.unk_id) for ids in encoded)
    assert 0 < unknown < sum(map(len, encoded))
    assert report["unknown_source_tokens"] == round(unknown / sum(map(len, encoded)), 4)
    assert UNK not in (tmp_path / "t.hyp").read_text()

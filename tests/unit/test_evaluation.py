"""Scores, reports, checkpoint averaging and run events, without training a model."""

import json
from pathlib import Path

import pytest
import sacrebleu
import torch

from transformer_mt.average import average_files, average_state_dicts
from transformer_mt.checkpoint import atomic_save, load_checkpoint
from transformer_mt.config import DecodeConfig
from transformer_mt.errors import TmtError
from transformer_mt.evaluate import EvalSet, evaluate, file_test_set, write_outputs
from transformer_mt.unk import UnknownCounts

REFERENCES = ["Il gatto dorme sul divano.", "Dov'è la stazione?", "Amo leggere libri.",
              "Tom è mio amico."]
HYPOTHESES = ["Il gatto dorme sul letto.", "Dov'è la stazione?", "Mi piace leggere libri.",
              "Tom è il mio amico."]


class FixedTranslator:
    """Stands in for a model: translates each known source to a fixed hypothesis."""

    def __init__(self, outputs: dict[str, str]):
        self.outputs = outputs
        self.decode_cfg = DecodeConfig()
        self.device = torch.device("cpu")
        self.calls: list[list[str]] = []
        self.replace_unk = False

    def translate_counting(self, sentences):
        self.calls.append(list(sentences))
        return [self.outputs[s] for s in sentences], UnknownCounts()


def test_report_scores_agree_with_sacrebleu(tmp_path):
    sources = [f"source {i}" for i in range(len(REFERENCES))]
    translator = FixedTranslator(dict(zip(sources, HYPOTHESES)))
    hypotheses, report = evaluate(translator, EvalSet("fixture", sources, REFERENCES),
                                  Path("ck.pt"))
    assert hypotheses == HYPOTHESES
    expected_bleu = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    expected_chrf = sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES])
    assert report["bleu"] == pytest.approx(expected_bleu.score, abs=0.01)
    assert report["chrf"] == pytest.approx(expected_chrf.score, abs=0.01)
    assert 0 < report["bleu"] < 100
    assert report["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert report["sentences"] == 4 and report["decoding"]["beam_size"] == 1

    json_path = write_outputs(hypotheses, report, tmp_path / "out" / "fixture.hyp")
    assert (tmp_path / "out" / "fixture.hyp").read_text().splitlines() == HYPOTHESES
    saved = json.loads(json_path.read_text())
    assert saved["bleu"] == report["bleu"] and saved["hypotheses"].endswith("fixture.hyp")


def test_perfect_hypotheses_score_100():
    translator = FixedTranslator({r: r for r in REFERENCES})
    _, report = evaluate(translator, EvalSet("t", REFERENCES, REFERENCES), Path("ck.pt"))
    assert report["bleu"] == 100.0 and report["chrf"] == 100.0


def test_a_source_with_several_references_is_translated_once():
    translator = FixedTranslator({"Hi.": "Ciao."})
    hypotheses, report = evaluate(translator, EvalSet("t", ["Hi.", "Hi."], ["Ciao.", "Salve."]),
                                  Path("ck.pt"))
    assert translator.calls == [["Hi."]] and hypotheses == ["Ciao.", "Ciao."]
    assert report["sentences"] == 2 and report["translated"] == 1


def test_mismatched_line_counts_are_refused(tmp_path):
    src, ref = tmp_path / "a.en", tmp_path / "a.it"
    src.write_text("one\ntwo\nthree\n")
    ref.write_text("uno\ndue\n")
    with pytest.raises(TmtError, match=r"3 lines but .* has 2"):
        file_test_set(src, ref)
    ref.write_text("uno\ndue\ntre")           # no final newline: still three lines
    assert file_test_set(src, ref).references == ["uno", "due", "tre"]


def _state(seed: int) -> dict:
    torch.manual_seed(seed)
    return {"w": torch.randn(5, 3), "b": torch.randn(3), "count": torch.tensor(7)}


def test_average_of_identical_checkpoints_is_that_checkpoint(tmp_path):
    state = {"model": _state(0), "config": {"name": "x"}, "tokenizers": {"src": "s", "tgt": "t"},
             "step": 10, "optimizer": {"unused": 1}}
    paths = []
    for i in range(3):
        paths.append(tmp_path / f"step{i:08d}.pt")
        atomic_save(state, paths[-1])
    averaged = load_checkpoint(average_files(paths, tmp_path / "avg.pt"))
    for key, tensor in state["model"].items():
        assert torch.equal(averaged["model"][key], tensor), key
    assert averaged["step"] == 10 and "optimizer" not in averaged
    assert [a["file"] for a in averaged["averaged_from"]] == [str(p) for p in paths]


def test_average_is_the_elementwise_mean():
    a, b = _state(0), _state(1)
    mean = average_state_dicts([a, b])
    assert torch.allclose(mean["w"], (a["w"] + b["w"]) / 2)
    assert mean["count"].item() == 7


def test_average_refuses_different_models_and_counts_a_hard_link_once(tmp_path):
    with pytest.raises(TmtError, match="differently shaped"):
        average_state_dicts([_state(0), {**_state(1), "w": torch.zeros(2, 2)}])
    state = {"model": _state(0), "config": {}, "tokenizers": {}}
    atomic_save(state, tmp_path / "last.pt")
    (tmp_path / "step00000005.pt").hardlink_to(tmp_path / "last.pt")
    averaged = load_checkpoint(average_files([tmp_path / "step00000005.pt", tmp_path / "last.pt"],
                                             tmp_path / "avg.pt"))
    assert len(averaged["averaged_from"]) == 1

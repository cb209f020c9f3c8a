"""End to end through the `tmt` command line on one tiny BPE run: evaluate, translate with beam,
n-best and attention, info, average, and the plot script.

The run is trained by the real command in a subprocess; the commands under test then go through
`cli.main` in this process (same parsing and wiring, without a fresh interpreter and torch import
for each of them), except where the exit code and stderr of a real process are the point."""

import json
import runpy
import shutil
import subprocess
import sys

import pytest
import sacrebleu
import torch
from conftest import ROOT, run_tmt, tiny_config_text
from datasets import load_from_disk
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from transformer_mt.cli import main
from transformer_mt.config import config_from_dict
from transformer_mt.events import read_scalars
from transformer_mt.model import build_model, count_parameters
from transformer_mt.names import names_copied
from transformer_mt.search import Hypothesis
from transformer_mt.translator import Translator

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SENTENCES = ["I love reading books.", "Where is the station?", "Tom is my friend."]


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory, corpus_tsv):
    """Ten steps of a tiny model with a joint BPE vocabulary; step checkpoints 3, 5, 6, 9, 10
    kept, validations (with BLEU) at steps 5 and 10."""
    folder = tmp_path_factory.mktemp("bpe_run")
    config = folder / "bpe.yaml"
    text = tiny_config_text(corpus_tsv, max_steps=10, keep_last=5)
    text = text.replace("tokenizer:\n", "tokenizer:\n  type: bpe\n  max_vocab: 600\n")
    config.write_text(text.replace("  d_ff: 64\n", "  d_ff: 64\n  tie_embeddings: true\n"))
    run_dir = folder / "run"
    result = run_tmt("train", "--config", str(config), "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr
    return run_dir


@pytest.fixture
def tmt(capsys):
    """Run `tmt ARGS` in this process; returns (exit code, stdout, stderr)."""
    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err
    return run


def _error_line(result):
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_bpe_run_shares_one_vocabulary_and_one_embedding(bpe_run):
    tokenizers = bpe_run / "tokenizers"
    assert (tokenizers / "src.json").read_text() == (tokenizers / "tgt.json").read_text()
    state = torch.load(bpe_run / "checkpoints" / "last.pt", weights_only=True)
    model = state["model"]
    assert torch.equal(model["src_embed.embedding.weight"], model["tgt_embed.embedding.weight"])
    assert torch.equal(model["projection.weight"], model["tgt_embed.embedding.weight"])


def test_evaluate_on_the_test_split_agrees_with_sacrebleu(bpe_run, tmt):
    code, out, _ = tmt("evaluate", "--run", str(bpe_run), "--json")
    assert code == 0
    report = json.loads(out)
    for key in ("bleu", "chrf", "signature", "sentences", "checkpoint", "seconds",
                "sentences_per_s", "decoding", "unknown_source_tokens", "outputs_with_unk"):
        assert key in report, key
    assert report["replace_unk"] is False             # off by default for subword vocabularies
    hypotheses = (bpe_run / "eval" / "test.best.beam1.hyp").read_text().splitlines()
    assert json.loads((bpe_run / "eval" / "test.best.beam1.json").read_text()) == report
    references = load_from_disk(str(bpe_run / "data" / "test"))["tgt"]
    assert len(hypotheses) == len(references) == report["sentences"]
    expected = sacrebleu.corpus_bleu(hypotheses, [list(references)]).score
    assert report["bleu"] == pytest.approx(expected, abs=0.01)


def test_evaluate_split_valid_scores_the_whole_validation_split(bpe_run, tmt):
    code, out, _ = tmt("evaluate", "--run", str(bpe_run), "--split", "valid", "--json")
    assert code == 0
    report = json.loads(out)
    references = load_from_disk(str(bpe_run / "data" / "valid"))["tgt"]
    hypotheses = (bpe_run / "eval" / "valid.best.beam1.hyp").read_text().splitlines()
    assert report["test_set"] == "valid" and report["sentences"] == len(references)
    expected = sacrebleu.corpus_bleu(hypotheses, [list(references)]).score
    assert report["bleu"] == pytest.approx(expected, abs=0.01)
    for refused in (["--split", "valid", "--unseen"], ["--split", "test", "--src", "a", "--ref", "b"]):
        code, _, err = tmt("evaluate", "--run", str(bpe_run), *refused)
        assert code != 0 and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1 and err.startswith("tmt: "), err


def test_evaluate_unseen_scores_the_sets_beside_the_test_split(bpe_run, tmt):
    code, out, _ = tmt("evaluate", "--run", str(bpe_run), "--unseen", "--json")
    assert code == 0
    report = json.loads(out)
    assert set(report["unseen"]) == {"rare_words", "names"}
    test_sources = set(load_from_disk(str(bpe_run / "data" / "test"))["src"])
    rare = (bpe_run / "eval" / "unseen" / "rare_words.src").read_text().splitlines()
    assert set(rare) <= test_sources               # a subset of the test split, as it is
    for scores in report["unseen"].values():
        if scores["sentences"]:
            assert 0 <= scores["bleu"] <= 100
            assert len(open(scores["hypotheses"]).read().splitlines()) == scores["sentences"]
    names = report["unseen"]["names"]
    if names["sentences"]:
        sources = (bpe_run / "eval" / "unseen" / "names.src").read_text().splitlines()
        hypotheses = open(names["hypotheses"]).read().splitlines()
        assert names["names_copied"] == round(names_copied(sources, hypotheses), 4)
    code, out, _ = tmt("evaluate", "--run", str(bpe_run), "--unseen")
    assert code == 0 and "rare_words: BLEU" in out and "names: BLEU" in out


def test_evaluate_files_with_beam_and_batch_tokens(bpe_run, tmp_path, tmt):
    src, ref = tmp_path / "t.en", tmp_path / "t.it"
    src.write_text("\n".join(SENTENCES) + "\n")
    ref.write_text("Amo leggere libri.\nDov'è la stazione?\nTom è mio amico.\n")
    hyp = tmp_path / "hyp" / "t.it.hyp"
    code, out, _ = tmt("evaluate", "--run", str(bpe_run), "--checkpoint", "last", "--src",
                       str(src), "--ref", str(ref), "--beam", "3", "--batch-tokens", "16",
                       "--output", str(hyp))
    assert code == 0
    assert "BLEU" in out and "nrefs:1" in out
    report = json.loads(hyp.with_suffix(".json").read_text())
    assert report["decoding"]["beam_size"] == 3 and report["decoding"]["batch_tokens"] == 16
    assert report["checkpoint"].endswith("last.pt") and report["sentences"] == 3
    assert len(hyp.read_text().splitlines()) == 3

    ref.write_text("Amo leggere libri.\n")
    mismatched = run_tmt("evaluate", "--run", str(bpe_run), "--src", str(src), "--ref", str(ref))
    assert "3 lines but" in _error_line(mismatched)


def test_evaluate_refuses_stdout_redirected_to_its_own_report(bpe_run, tmp_path):
    """`tmt evaluate --json --output X.hyp > X.json` would interleave two writers in one file."""
    src, ref = tmp_path / "t.en", tmp_path / "t.it"
    src.write_text("\n".join(SENTENCES) + "\n")
    ref.write_text("Amo leggere libri.\nDov'è la stazione?\nTom è mio amico.\n")
    command = [sys.executable, "-m", "transformer_mt", "evaluate", "--run", str(bpe_run),
               "--src", str(src), "--ref", str(ref), "--json", "--output", str(tmp_path / "x.hyp")]
    for target in ("x.json", "x.hyp"):
        with open(tmp_path / target, "w") as stdout:
            result = subprocess.run(command, stdout=stdout, stderr=subprocess.PIPE, text=True,
                                    timeout=300)
        assert "standard output is redirected to" in _error_line(result)
        assert (tmp_path / target).read_text() == ""
    with open(tmp_path / "report.json", "w") as stdout:      # elsewhere: one clean JSON object
        assert subprocess.run(command, stdout=stdout, timeout=300).returncode == 0
    assert json.loads((tmp_path / "report.json").read_text())["sentences"] == 3
    assert json.loads((tmp_path / "x.json").read_text())["sentences"] == 3


def test_translate_beam_nbest_files_and_checkpoint_names(bpe_run, tmp_path, tmt):
    source = tmp_path / "in.en"
    source.write_text("\n".join(SENTENCES) + "\n")
    output = tmp_path / "out.it"
    code, out, _ = tmt("translate", "--run", str(bpe_run), "--checkpoint", "last", "--beam", "4",
                       "--input", str(source), "--output", str(output))
    assert code == 0 and out == "" and len(output.read_text().splitlines()) == 3

    code, out, _ = tmt("translate", "--run", str(bpe_run), "--nbest", "3", *SENTENCES[:2])
    assert code == 0
    rows = [line.split(" ||| ") for line in out.splitlines()]
    assert {int(r[0]) for r in rows} == {0, 1} and all(len(r) == 3 for r in rows)
    for index in (0, 1):
        texts = [r[1] for r in rows if int(r[0]) == index]
        scores = [float(r[2]) for r in rows if int(r[0]) == index]
        assert 1 <= len(texts) <= 3 and len(set(texts)) == len(texts)
        assert scores == sorted(scores, reverse=True)

    code, out, _ = tmt("translate", "--checkpoint", "best", "--runs-dir", str(bpe_run.parent),
                       SENTENCES[0])
    assert code == 0 and out.count("\n") == 1


def test_nbest_lists_each_distinct_text_once(bpe_run, monkeypatch):
    translator = Translator.from_checkpoint(bpe_run / "checkpoints" / "last.pt", "cpu")
    word = translator.tgt_codec.encode("amico")
    pad = translator.tgt_codec.pad_id
    # Two token sequences that detokenize to the same text, and one other text.
    monkeypatch.setattr(translator, "search", lambda *args, **kwargs: [[
        Hypothesis(word, -1.0), Hypothesis(word + [pad], -2.0), Hypothesis([], -3.0)]])
    assert translator.translate_nbest(["x"], nbest=5) == [
        [("amico", -1.0), ("", -3.0)]]


def test_batch_token_budget_changes_batches_not_translations(bpe_run):
    path = bpe_run / "checkpoints" / "last.pt"
    default = Translator.from_checkpoint(path, "cpu")
    small = Translator.from_checkpoint(path, "cpu", batch_tokens=12)
    encoded = [small.encode_source(s) for s in SENTENCES]
    for batch in small._batches(encoded):
        longest = max(len(encoded[i]) for i in batch) + 2
        assert len(batch) == 1 or len(batch) * longest <= 12
    assert small.translate(SENTENCES) == default.translate(SENTENCES)


def test_the_translator_searches_with_its_decode_settings(bpe_run, monkeypatch):
    from transformer_mt import translator as translator_module

    searches = []
    real = translator_module.beam_search

    def recording(model, src, mask, limits, beam_size, alpha, nbest):
        searches.append((beam_size, alpha, limits.max_len_a, limits.max_len_b))
        return real(model, src, mask, limits, beam_size, alpha, nbest)
    monkeypatch.setattr(translator_module, "beam_search", recording)
    path = bpe_run / "checkpoints" / "last.pt"
    translator = Translator.from_checkpoint(path, "cpu", beam_size=3, length_penalty=1.5,
                                            max_len_b=4)
    translator.translate(SENTENCES[:1])
    translator.translate_nbest(SENTENCES[:1], 5)
    translator.with_decoding(length_penalty=0.0).translate(SENTENCES[:1])
    translator.with_decoding(beam_size=1).translate(SENTENCES[:1])      # greedy: no beam
    a = translator.decode_cfg.max_len_a
    assert searches == [(3, 1.5, a, 4), (5, 1.5, a, 4), (3, 0.0, a, 4)]


def test_attention_plot_and_tensorboard_images(bpe_run, tmp_path, tmt):
    picture = tmp_path / "attention.png"
    code, out, _ = tmt("translate", "--run", str(bpe_run), "--attention", str(picture),
                       SENTENCES[0])
    assert code == 0 and out.count("\n") == 1
    assert picture.read_bytes().startswith(PNG_MAGIC)
    code, _, err = tmt("translate", "--run", str(bpe_run), "--attention", str(picture),
                       *SENTENCES)
    assert code != 0 and "exactly one sentence" in err

    image_tags = set()
    for events in (bpe_run / "tensorboard").glob("events.out.tfevents.*"):
        for event in EventFileLoader(str(events)).Load():
            image_tags |= {v.tag for v in event.summary.value
                           if v.metadata.plugin_data.plugin_name == "images"}
    assert {"valid/attention/0", "valid/attention/4"} <= image_tags


def test_attention_weights_cover_source_and_output(bpe_run):
    from transformer_mt.attention_plot import cross_attention

    translator = Translator.from_checkpoint(bpe_run / "checkpoints" / "last.pt", "cpu")
    alignment = cross_attention(translator, SENTENCES[1])
    output = translator.translate_ids([SENTENCES[1]])[0][0]
    source = translator.encode_source(SENTENCES[1])
    assert alignment.weights.shape == (len(output) + 1, len(source) + 2)
    assert alignment.tgt_tokens[-1] == "[EOS]" and alignment.src_tokens[0] == "[SOS]"
    assert alignment.weights.sum(axis=1) == pytest.approx(1.0, abs=1e-5)


def test_info_reports_the_run(bpe_run, tmt):
    code, out, _ = tmt("info", "--run", str(bpe_run), "--json")
    assert code == 0
    info = json.loads(out)
    state = torch.load(bpe_run / "checkpoints" / "last.pt", weights_only=True)
    cfg = config_from_dict(state["config"])
    model = build_model(cfg.model, state["vocab"]["src"], state["vocab"]["tgt"], joint_vocab=True)
    assert info["model"]["parameters"] == count_parameters(model)
    assert info["model"]["tokenizer"] == "bpe" and info["training"]["step"] == 10
    assert info["best_validation"]["step"] in (5, 10)
    assert info["best_validation"]["validations"] == 2
    files = {c["file"]: c for c in info["checkpoints"]}
    assert files["step00000010.pt"]["same_file_as"] == "last.pt"
    code, out, _ = tmt("info", "--run", str(bpe_run))
    assert "parameters" in out and "best validation (by loss, best.pt): step" in out
    assert info["best_validation"]["metric"] == "loss"
    assert info["best_validation"]["step"] == torch.load(
        bpe_run / "checkpoints" / "best.pt", weights_only=True)["step"]


def test_info_on_a_run_from_before_validation_losses_were_kept(bpe_run, tmp_path, tmt):
    """Its last.pt ranked by BLEU and holds no losses: info says so, with the loss of the
    best validation from the event files."""
    old_run = tmp_path / "old"
    shutil.copytree(bpe_run, old_run)
    state = torch.load(old_run / "checkpoints" / "last.pt", weights_only=True)
    for key in ("best_metric", "validation_loss"):
        del state[key]
    state["best_step"] = max(state["validation_bleu"], key=lambda s_b: (s_b[1], -s_b[0]))[0]
    torch.save(state, old_run / "checkpoints" / "last.pt")
    code, out, _ = tmt("info", "--run", str(old_run), "--json")
    best = json.loads(out)["best_validation"]
    losses = {s.step: s.value for s in read_scalars(old_run / "tensorboard")["valid/loss"]}
    assert code == 0 and best["metric"] == "bleu" and best["step"] == state["best_step"]
    assert best["loss"] == pytest.approx(losses[best["step"]], abs=1e-4)


def test_average_last_and_best_checkpoints(bpe_run, tmp_path, tmt):
    code, out, _ = tmt("average", "--run", str(bpe_run), "--last", "3")
    averaged = bpe_run / "checkpoints" / "average_last3.pt"
    assert code == 0 and out.strip() == str(averaged)
    state = torch.load(averaged, weights_only=True)
    assert [a["step"] for a in state["averaged_from"]] == [6, 9, 10]
    # The tied embedding matrices are still one tensor.
    assert (state["model"]["src_embed.embedding.weight"].data_ptr()
            == state["model"]["projection.weight"].data_ptr())
    assert tmt("translate", "--checkpoint", str(averaged), SENTENCES[0])[0] == 0

    code, _, _ = tmt("average", "--run", str(bpe_run), "--best", "2", "--output",
                     str(tmp_path / "best2.pt"))
    assert code == 0
    steps = [a["step"] for a in torch.load(tmp_path / "best2.pt",
                                           weights_only=True)["averaged_from"]]
    assert steps == [5, 10]             # the only kept checkpoints written at a validation
    code, _, err = tmt("average", "--run", str(bpe_run), "--best", "3")
    assert code != 0 and "only 2 of the 5" in err


def test_plot_script_draws_a_real_run(bpe_run, tmp_path):
    script = ROOT / "scripts" / "plot_run.py"
    picture = tmp_path / "curves.png"
    result = subprocess.run([sys.executable, str(script), str(bpe_run), str(picture)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert picture.read_bytes().startswith(PNG_MAGIC)
    plot_runs = runpy.run_path(str(script), run_name="plot_run")["plot_runs"]
    plot_runs([bpe_run, bpe_run], tmp_path / "hours.png", x="hours")
    assert (tmp_path / "hours.png").read_bytes().startswith(PNG_MAGIC)

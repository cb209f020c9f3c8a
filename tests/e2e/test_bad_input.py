"""The bad-input catalogue: each case ends in one clear line, never a traceback."""

import json
import os
import subprocess
import sys

import pytest
from conftest import run_tmt, tiny_config_text, write_tsv

from transformer_mt.config import DataConfig
from transformer_mt.errors import TmtError
from transformer_mt.readers import load_corpus


def _error_line(result) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode != 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("tmt: error: "), result.stderr
    return lines[-1]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, corpus_tsv):
    base = tmp_path_factory.mktemp("trained")
    config = base / "c.yaml"
    config.write_text(tiny_config_text(corpus_tsv, max_steps=3))
    result = run_tmt("train", "--config", str(config), "--run-dir", str(base / "run"))
    assert result.returncode == 0, result.stderr
    return base / "run"


def _config(tmp_path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("change, expected", [
    (("lr: 0.003", "lr: -0.1"), "train.lr: must be > 0"),
    (("d_model: 32", "d_model: 33"), "model.d_model (33) must be divisible by model.heads (2)"),
    (("d_ff: 64", "d_ff: 64\n  dropout: 1.0"), "model.dropout: must be < 1"),
    (("  layers: 1", "  layers: -2"), "model.layers: must be >= 1"),
])
def test_out_of_range_values(tmp_path, corpus_tsv, change, expected):
    text = tiny_config_text(corpus_tsv).replace(*change)
    assert expected in _error_line(run_tmt("train", "--config", _config(tmp_path, text)))


@pytest.mark.parametrize("text, expected", [
    ("", "the file is empty"),
    ("model: [1, 2\n", "fix the YAML syntax"),
    ("- just\n- a list\n", "top level must be a mapping"),
])
def test_empty_or_invalid_yaml(tmp_path, text, expected):
    assert expected in _error_line(run_tmt("train", "--config", _config(tmp_path, text)))


def test_corpus_with_malformed_lines_is_trained_on_with_a_warning(tmp_path, corpus_tsv):
    lines = corpus_tsv.read_text().splitlines()
    lines[3] = "no tab in this line"
    lines[10] = "one\ttab\ttoo many"
    corpus = tmp_path / "bad.tsv"
    corpus.write_text("\n".join(lines) + "\n")
    config = _config(tmp_path, tiny_config_text(corpus, max_steps=1))
    result = run_tmt("train", "--config", config, "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert "skipped 2 of 600 lines" in result.stderr and "(lines 4, 11)" in result.stderr


def test_corpus_with_no_usable_pairs(tmp_path):
    corpus = write_tsv(tmp_path / "empty.tsv", [("  ", "x"), ("y", "\u200b")])
    config = _config(tmp_path, tiny_config_text(corpus))
    assert "no usable sentence pairs" in _error_line(
        run_tmt("train", "--config", config, "--run-dir", str(tmp_path / "run")))


def test_unknown_language_pair(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"translation": {"en": "a", "fr": "b"}}) + "\n")
    text = tiny_config_text(corpus).replace("source: tsv", "source: jsonl")
    assert "no language 'it'" in _error_line(
        run_tmt("train", "--config", _config(tmp_path, text), "--run-dir", str(tmp_path / "r")))


def test_unknown_hub_dataset(monkeypatch, tmp_path):
    import datasets

    from transformer_mt import readers

    def not_found(*args, **kwargs):
        raise datasets.exceptions.DatasetNotFoundError("Dataset 'nobody/nothing' doesn't exist")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.setattr(readers, "_hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(datasets, "load_dataset", not_found)
    with pytest.raises(TmtError, match="cannot load 'nobody/nothing'.*doesn't exist"):
        load_corpus(DataConfig(source="hub", hub_name="nobody/nothing"), tmp_path)


def test_run_directory_not_writable(tmp_path, tiny_config):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert "is not writable" in _error_line(
        run_tmt("train", "--config", str(tiny_config), "--run-dir", str(blocker / "run")))


def test_truncated_checkpoint_on_resume(tmp_path, trained_run, tiny_config):
    import shutil
    run_dir = tmp_path / "copy"
    shutil.copytree(trained_run, run_dir)
    last = run_dir / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])
    assert "corrupt or truncated" in _error_line(
        run_tmt("train", "--config", str(tiny_config), "--run-dir", str(run_dir), "--resume"))


def _translate(trained_run, *sentences, stdin=None):
    result = run_tmt("translate", "--run", str(trained_run), *sentences, stdin=stdin)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return result


def test_empty_and_whitespace_lines_give_empty_lines(trained_run):
    result = _translate(trained_run, stdin="\n   \nHello.\n\t\n")
    lines = result.stdout.split("\n")
    assert len(lines) == 5 and lines[0] == lines[1] == lines[3] == "" and lines[2]


def test_a_ten_thousand_word_sentence_is_truncated_with_a_warning(trained_run):
    result = _translate(trained_run, "word " * 10000)
    assert result.stdout.count("\n") == 1
    assert "truncated to decode.max_input_tokens" in result.stderr


def test_other_scripts_control_characters_and_unknown_words(trained_run):
    result = _translate(trained_run, "東京は大きい。", "Hello\x07\u200bworld\x1b[31m",
                        "Xyzzy plugh qwertz.")
    assert result.stdout.count("\n") == 3


def test_stdin_closed_at_once(trained_run):
    result = run_tmt("translate", "--run", str(trained_run), stdin="")
    assert result.returncode == 0 and result.stdout == "" and "Traceback" not in result.stderr


def test_reader_that_goes_away_early(trained_run):
    producer = "Hello.\n" * 2000
    pipeline = subprocess.run(
        f"{sys.executable} -m transformer_mt translate --run {trained_run} | head -n 1",
        shell=True, input=producer, capture_output=True, text=True, timeout=300)
    assert pipeline.stdout.count("\n") == 1
    assert "Traceback" not in pipeline.stderr and "BrokenPipe" not in pipeline.stderr


def test_crafted_checkpoint_is_refused_by_translate(tmp_path):
    import os

    import torch

    class Exploit:
        def __reduce__(self):
            return (os.system, ("true",))
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "config": {}, "x": Exploit()}, path)
    assert "refused to load" in _error_line(run_tmt("translate", "--checkpoint", str(path),
                                                    "Hello."))


def test_checkpoint_with_an_invalid_config(tmp_path, trained_run):
    import torch
    state = torch.load(trained_run / "checkpoints" / "last.pt", weights_only=True)
    state["config"]["model"]["heads"] = 3
    path = tmp_path / "odd.pt"
    torch.save(state, path)
    assert "divisible by model.heads" in _error_line(
        run_tmt("translate", "--checkpoint", str(path), "Hello."))


_MAIN_THEN_REPORT_TORCH = """
import sys
from transformer_mt.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("torch imported:", "torch" in sys.modules, file=sys.stderr)
"""


@pytest.mark.parametrize("command", [
    ("translate", "--run", "{run}", "Hello.", "--output", "{run}/checkpoints/best.pt"),
    ("evaluate", "--run", "{run}", "--src", "s.txt", "--ref", "s.txt", "--output", "s.txt"),
    ("average", "a.pt", "b.pt", "--output", "a.pt"),
    ("average", "--run", "{run}", "--last", "0"),
], ids=["translate-over-checkpoint", "evaluate-over-src", "average-over-input", "average-last-0"])
def test_mistakes_are_refused_before_torch_is_imported(command, trained_run, tmp_path):
    """A mistaken command answers at once, not after the seconds torch takes to import."""
    (tmp_path / "s.txt").write_text("Hello.\n")
    for name in ("a.pt", "b.pt"):
        (tmp_path / name).write_bytes((trained_run / "checkpoints" / "last.pt").read_bytes())
    args = [a.format(run=trained_run) for a in command]
    result = subprocess.run([sys.executable, "-c", _MAIN_THEN_REPORT_TORCH, *args], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert "tmt: error: " in result.stderr, result.stderr
    assert "torch imported: False" in result.stderr, result.stderr


def test_a_folder_that_is_not_a_run_is_refused_before_torch_is_imported(tmp_path, corpus_tsv):
    config = tmp_path / "c.yaml"
    config.write_text(tiny_config_text(corpus_tsv, max_steps=1))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not tmt's\n")
    result = subprocess.run([sys.executable, "-c", _MAIN_THEN_REPORT_TORCH, "train", "--config",
                             str(config), "--run-dir", str(tmp_path / "mine")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert "tmt: error: " in result.stderr, result.stderr
    assert "torch imported: False" in result.stderr, result.stderr
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_a_web_server_that_cannot_be_imported_is_one_line(tmp_path, trained_run):
    """As on a machine whose FastAPI needs a package that is missing (seen: opentelemetry)."""
    fake = tmp_path / "site" / "fastapi"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'x'\")\n")
    path = os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")]))
    result = run_tmt("serve", "--checkpoint", str(trained_run / "checkpoints" / "last.pt"),
                     env={"PYTHONPATH": path})
    assert "tmt serve cannot load its web server (No module named 'x')" in _error_line(result)

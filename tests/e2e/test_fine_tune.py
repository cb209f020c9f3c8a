"""Fine-tuning (train.init_from): a new run starts from another run's weights and tokenizers."""

import subprocess
from pathlib import Path

import pytest
import torch
from conftest import run_tmt, tiny_config_text

from transformer_mt.checkpoint import load_checkpoint


@pytest.fixture(scope="module")
def parent(tmp_path_factory, corpus_tsv) -> Path:
    folder = tmp_path_factory.mktemp("parent")
    config = folder / "tiny.yaml"
    config.write_text(tiny_config_text(corpus_tsv, max_steps=6), encoding="utf-8")
    result = run_tmt("train", "--config", str(config), "--run-dir", str(folder / "run"))
    assert result.returncode == 0, result.stderr
    return folder


def _fine_tune(parent: Path, run_dir: Path, *settings: str) -> subprocess.CompletedProcess:
    return run_tmt("train", "--config", str(parent / "tiny.yaml"), "--run-dir", str(run_dir),
                   "--set", f"train.init_from={parent / 'run' / 'checkpoints' / 'last.pt'}",
                   *(arg for setting in settings for arg in ("--set", setting)))


def test_a_fine_tuning_run_starts_from_the_checkpoints_weights_and_tokenizers(parent, tmp_path):
    # A learning rate of 1e-9 keeps the weights where the first step found them.
    result = _fine_tune(parent, tmp_path / "ft", "train.lr=1e-9", "train.max_steps=1",
                        "data.copy_augment=0.5")
    assert result.returncode == 0, result.stderr
    assert "fine-tuning: weights and tokenizers of" in result.stderr
    start = load_checkpoint(parent / "run" / "checkpoints" / "last.pt")
    tuned = load_checkpoint(tmp_path / "ft" / "checkpoints" / "last.pt")
    assert tuned["step"] == 1
    for name, tensor in start["model"].items():
        assert torch.allclose(tensor, tuned["model"][name], atol=1e-6), name
    for side in ("src", "tgt"):
        assert ((tmp_path / "ft" / "tokenizers" / f"{side}.json").read_bytes()
                == (parent / "run" / "tokenizers" / f"{side}.json").read_bytes())
    # The control: a run of its own starts elsewhere.
    fresh = run_tmt("train", "--config", str(parent / "tiny.yaml"), "--run-dir",
                    str(tmp_path / "fresh"), "--set", "train.lr=1e-9", "--set",
                    "train.max_steps=1")
    assert fresh.returncode == 0, fresh.stderr
    own = load_checkpoint(tmp_path / "fresh" / "checkpoints" / "last.pt")["model"]
    assert not all(torch.allclose(t, own[n], atol=1e-6) for n, t in start["model"].items())
    # It resumes from its own checkpoints like any run.
    resumed = run_tmt("train", "--resume", "--run-dir", str(tmp_path / "ft"), "--max-steps", "2")
    assert resumed.returncode == 0 and "resumed" in resumed.stderr, resumed.stderr


@pytest.mark.parametrize("setting, message", [
    ("model.d_model=64", "train.init_from: {ck} was trained with other settings: model.d_model "
                         "(32 there, 64 here); set them as it had them"),
    ("tokenizer.min_frequency=2", "tokenizer.min_frequency (1 there, 2 here)"),
    ("train.init_from=missing.pt", "train.init_from: no checkpoint file"),
])
def test_a_checkpoint_that_cannot_start_the_run_is_refused_in_one_line(parent, tmp_path, setting,
                                                                       message):
    result = _fine_tune(parent, tmp_path / "ft", setting)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert message.format(ck=parent / "run" / "checkpoints" / "last.pt") in lines[0]
    assert not (tmp_path / "ft" / "checkpoints").exists()

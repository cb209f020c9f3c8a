"""What a run does and says at its edges: no step to train, no validation during the run, faults
before the first checkpoint, and the progress lines of train.log."""

import math
import re
import sys
import time

import pytest
from conftest import ROOT

from transformer_mt.batching import Collator
from transformer_mt.checkpoint import read_checkpoint
from transformer_mt.cli import main
from transformer_mt.events import read_scalars
from transformer_mt.model import Transformer

# The step line scripts/bench_data.py reads from train.log.
sys.path.insert(0, str(ROOT / "scripts"))
from bench_data import STEP_LINE  # noqa: E402


def _train(tiny_config, run_dir, *extra: str) -> int:
    return main(["train", "--config", str(tiny_config), "--run-dir", str(run_dir), *extra])


def test_max_steps_0_prepares_the_run_and_trains_nothing(tmp_path, tiny_config, capsys):
    run_dir = tmp_path / "run"
    assert _train(tiny_config, run_dir, "--max-steps", "0") == 0
    assert "no step to train: the run is at step 0 of 0" in capsys.readouterr().err
    assert (run_dir / "tokenizers" / "tgt.json").is_file()
    assert not (run_dir / "checkpoints" / "last.pt").exists()


def test_a_run_without_validation_on_the_way_validates_at_its_end(tmp_path, tiny_config):
    run_dir = tmp_path / "run"
    assert _train(tiny_config, run_dir, "--set", "train.valid_every=1000") == 0
    log = (run_dir / "train.log").read_text()
    assert "validation at step 6:" in log and "BLEU -1.00" not in log
    assert (run_dir / "checkpoints" / "best.pt").is_file()


VALIDATION_LINE = re.compile(r"validation at step (\d+): loss ([\d.]+), ppl [\d.]+, BLEU ([\d.]+)")


@pytest.mark.parametrize("metric", ["loss", "bleu"])
def test_best_pt_and_patience_follow_train_best_metric(tmp_path, tiny_config, metric):
    """best.pt is the validation with the lowest loss (or highest BLEU; the earlier of equals),
    and train.patience stops at the first validation that makes it too many without a better
    one: replayed from the scores train.log shows."""
    run_dir = tmp_path / "run"
    assert _train(tiny_config, run_dir, "--set", "train.valid_every=1", "--set",
                  f"train.best_metric={metric}", "--set", "train.patience=2") == 0
    log = (run_dir / "train.log").read_text()
    validations = [(int(m[1]), float(m[2]), float(m[3])) for m in VALIDATION_LINE.finditer(log)]
    score = {"loss": lambda v: -v[1], "bleu": lambda v: v[2]}[metric]
    best, without_better, stopped_at = None, 0, None
    for validation in validations:
        if best is None or score(validation) > score(best):
            best, without_better = validation, 0
        else:
            without_better += 1
        if without_better == 2:
            stopped_at = validation[0]
            break
    assert read_checkpoint(run_dir / "checkpoints" / "best.pt").step == best[0]
    assert (f"early stopping at step {stopped_at}" in log) == (stopped_at is not None)
    assert validations[-1][0] == (stopped_at or 6)
    assert f"best validation: step {best[0]} (by {metric})" in log


def test_train_log_has_a_progress_line_every_log_every_steps(tmp_path, tiny_config):
    run_dir = tmp_path / "run"
    assert _train(tiny_config, run_dir, "--set", "train.log_every=2") == 0
    lines = [line for line in (run_dir / "train.log").read_text().splitlines()
             if " INFO step " in line]
    assert [line.split(" INFO step ")[1].split(":")[0] for line in lines] == ["2", "4", "6"]
    assert all("loss" in line and "lr" in line and "tokens/s" in line and "data wait" in line
               for line in lines)
    parsed = [m for m in STEP_LINE.finditer((run_dir / "train.log").read_text())]
    assert len(parsed) == 3 and all(float(m["tokens_per_s"]) > 0 and 0 <= float(m["data_wait"]) < 100
                                    for m in parsed)
    # Model FLOPs utilisation and the share of time spent waiting for batches go to TensorBoard
    # with each progress line.
    scalars = read_scalars(run_dir / "tensorboard")
    mfu, data_wait = scalars["train/mfu"], scalars["train/data_wait"]
    assert [s.step for s in mfu] == [2, 4, 6] and all(0 < s.value < math.inf for s in mfu)
    assert [s.step for s in data_wait] == [2, 4, 6] and all(0 <= s.value < 1 for s in data_wait)


def test_data_wait_shows_when_batches_come_slowly(tmp_path, tiny_config, monkeypatch):
    real = Collator.__call__

    def slow_collate(self, pairs):
        time.sleep(0.5)         # far longer than a tiny model's step
        return real(self, pairs)

    monkeypatch.setattr(Collator, "__call__", slow_collate)
    run_dir = tmp_path / "run"
    assert _train(tiny_config, run_dir, "--set", "train.log_every=3", "--max-steps", "3") == 0
    data_wait = read_scalars(run_dir / "tensorboard")["train/data_wait"]
    assert [s.step for s in data_wait] == [3] and data_wait[0].value > 0.5


def test_faults_before_the_first_checkpoint_name_no_missing_file(tmp_path, tiny_config,
                                                                  monkeypatch, capsys):
    real = Transformer.loss
    monkeypatch.setattr(Transformer, "loss",
                        lambda *args, **kwargs: real(*args, **kwargs) * math.nan)
    run_dir = tmp_path / "run"
    assert _train(tiny_config, run_dir, "--set", "train.max_bad_steps=2") == 1
    err = capsys.readouterr().err
    assert "2 consecutive steps up to step 2" in err and "no checkpoint was written yet" in err
    assert "last.pt" not in err and not (run_dir / "checkpoints" / "last.pt").exists()

"""Exact resume and fault tolerance: interrupted runs end bitwise equal to unbroken ones."""

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import run_tmt, tiny_config_text

from transformer_mt.checkpoint import load_checkpoint

STEPS = 40


@pytest.fixture
def resume_config(tmp_path, corpus_tsv) -> Path:
    path = tmp_path / "resume.yaml"
    # dropout stays on (0.1 by default): resuming must restore the dropout RNG too.
    path.write_text(tiny_config_text(corpus_tsv, valid_every=10, checkpoint_every=4,
                                     max_steps=STEPS))
    return path


def _final_state(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def _assert_same_training_state(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] and a["epoch"] == b["epoch"]
    assert a["batch_in_epoch"] == b["batch_in_epoch"]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for pid, slots in a["optimizer"]["state"].items():
        for key, value in slots.items():
            assert torch.equal(torch.as_tensor(value),
                               torch.as_tensor(b["optimizer"]["state"][pid][key])), (pid, key)


@pytest.fixture
def unbroken(tmp_path, resume_config) -> dict:
    run_dir = tmp_path / "unbroken"
    result = run_tmt("train", "--config", str(resume_config), "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr
    return _final_state(run_dir)


def test_stop_and_resume_is_bitwise_identical(tmp_path, resume_config, unbroken):
    run_dir = tmp_path / "halves"
    # Stop at a step that is neither a checkpoint nor a validation step of the unbroken run.
    first = run_tmt("train", "--config", str(resume_config), "--run-dir", str(run_dir),
                    "--max-steps", "17")
    assert first.returncode == 0, first.stderr
    second = run_tmt("train", "--config", str(resume_config), "--run-dir", str(run_dir),
                     "--resume")
    assert second.returncode == 0, second.stderr
    _assert_same_training_state(_final_state(run_dir), unbroken)


def test_a_resume_reads_no_corpus_and_prepares_nothing(tmp_path, corpus_tsv, unbroken):
    # The same sentences as the unbroken run's corpus, in a file of this test's own.
    corpus = tmp_path / "own.tsv"
    shutil.copyfile(corpus_tsv, corpus)
    config = tmp_path / "own.yaml"
    config.write_text(tiny_config_text(corpus, valid_every=10, checkpoint_every=4,
                                       max_steps=STEPS))
    run_dir = tmp_path / "halves"
    first = run_tmt("train", "--config", str(config), "--run-dir", str(run_dir),
                    "--max-steps", "17")
    assert first.returncode == 0, first.stderr
    prepared = (run_dir / "train.log").read_text().count("stage ")
    corpus.unlink()
    second = run_tmt("train", "--run-dir", str(run_dir), "--resume", "--max-steps", str(STEPS))
    assert second.returncode == 0, second.stderr
    assert (run_dir / "train.log").read_text().count("stage ") == prepared   # nothing redone
    _assert_same_training_state(_final_state(run_dir), unbroken)


def _every_checkpoint_loads(run_dir: Path) -> None:
    for path in (run_dir / "checkpoints").glob("*.pt"):
        load_checkpoint(path)                       # raises on a half-written file


def _start(resume_config: Path, run_dir: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "transformer_mt", "train", "--config", str(resume_config),
            "--run-dir", str(run_dir)]
    if (run_dir / "checkpoints" / "last.pt").is_file():
        args.append("--resume")
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _kill_during_checkpoint_write(process: subprocess.Popen, run_dir: Path) -> bool:
    """Poll for a checkpoint's temporary file and SIGKILL the moment one exists."""
    checkpoints = run_dir / "checkpoints"
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
        if checkpoints.is_dir() and any(n.endswith(".tmp") for n in os.listdir(checkpoints)):
            process.kill()
            process.wait()
            return True
    process.kill()
    process.wait()
    return False


def _checkpoint_identity(last: Path) -> tuple[int, int] | None:
    try:
        status = os.stat(last)
    except FileNotFoundError:
        return None
    return status.st_ino, status.st_mtime_ns


def _kill_after_a_new_checkpoint(process: subprocess.Popen, run_dir: Path, delay: float) -> None:
    """SIGKILL `delay` seconds after a checkpoint newer than the one the process started from
    lands: a random moment of training that makes progress, whatever the machine's speed (a
    fixed wall-clock wait let a fast machine finish the run before it was killed)."""
    last = run_dir / "checkpoints" / "last.pt"
    started_from = _checkpoint_identity(last)
    deadline = time.monotonic() + 60
    while (process.poll() is None and time.monotonic() < deadline
           and _checkpoint_identity(last) == started_from):
        time.sleep(0.01)
    time.sleep(delay)
    process.kill()
    process.wait()


def test_sigkill_at_random_moments_then_resume_equals_unbroken(tmp_path, resume_config,
                                                               unbroken):
    run_dir = tmp_path / "killed"
    rng = random.Random(1)
    kills = caught_writing = 0
    for attempt in range(8):
        process = _start(resume_config, run_dir)
        if attempt % 2:
            caught_writing += _kill_during_checkpoint_write(process, run_dir)
        else:
            _kill_after_a_new_checkpoint(process, run_dir, rng.uniform(0.0, 0.15))
        kills += process.returncode == -signal.SIGKILL
        _every_checkpoint_loads(run_dir)
        if process.returncode == 0:
            break
    assert kills >= 3 and caught_writing >= 1, (kills, caught_writing)
    while True:                                     # finish the run
        process = _start(resume_config, run_dir)
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        if _final_state(run_dir)["step"] == STEPS:
            break
    _assert_same_training_state(_final_state(run_dir), unbroken)
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.suffix == ".tmp"]


def test_sigint_finishes_the_step_saves_and_exits_130(tmp_path, corpus_tsv):
    config = tmp_path / "long.yaml"
    config.write_text(tiny_config_text(corpus_tsv, max_steps=100000, checkpoint_every=100000,
                                       valid_every=100000))
    run_dir = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-m", "transformer_mt", "train", "--config",
                                str(config), "--run-dir", str(run_dir)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    log = run_dir / "train.log"
    while time.monotonic() < deadline and not (log.is_file() and "model:" in log.read_text()):
        time.sleep(0.2)
    time.sleep(2.0)                                 # let it train a few steps
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and stdout == ""
    assert f"tmt train --run-dir {run_dir} --resume" in stderr
    notice = "SIGINT: finishing the current step and saving a checkpoint"
    assert notice in stderr and notice in log.read_text()
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert state["step"] > 0


def test_a_decay_added_on_resume_equals_a_run_decayed_from_the_start(tmp_path, resume_config,
                                                                    unbroken):
    """What the README's schedule comparison relies on: a Noam run stopped where the decay would
    begin and resumed with train.decay_steps is the run that had the decay from its start."""
    decay = ["--set", "train.decay_steps=12"]
    decayed = tmp_path / "decayed"
    result = run_tmt("train", "--config", str(resume_config), "--run-dir", str(decayed), *decay)
    assert result.returncode == 0, result.stderr
    halves = tmp_path / "noam_then_decay"
    first = run_tmt("train", "--config", str(resume_config), "--run-dir", str(halves),
                    "--max-steps", str(STEPS - 12))
    assert first.returncode == 0, first.stderr
    second = run_tmt("train", "--config", str(resume_config), "--run-dir", str(halves),
                     "--resume", *decay)
    assert second.returncode == 0, second.stderr
    assert "train.decay_steps changed from None to 12" in (halves / "train.log").read_text()
    _assert_same_training_state(_final_state(halves), _final_state(decayed))
    # ... and the decay changed the run (unbroken: the same config without it).
    assert any(not torch.equal(tensor, unbroken["model"][name])
               for name, tensor in _final_state(decayed)["model"].items())


def test_a_resume_with_another_best_metric_lets_its_next_validation_replace_best_pt(
        tmp_path, resume_config):
    run_dir = tmp_path / "run"
    first = run_tmt("train", "--config", str(resume_config), "--run-dir", str(run_dir),
                    "--max-steps", "20", "--set", "train.best_metric=bleu")
    assert first.returncode == 0, first.stderr
    second = run_tmt("train", "--config", str(resume_config), "--run-dir", str(run_dir),
                     "--resume", "--max-steps", "30")
    assert second.returncode == 0, second.stderr
    assert "validations are ranked by loss from now on" in second.stderr
    best = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)
    assert best["best_metric"] == "loss" and best["step"] == best["best_step"] == 30
    third = run_tmt("train", "--config", str(resume_config), "--run-dir", str(run_dir),
                    "--resume", "--max-steps", "40", "--set", "train.label_smoothing=0.2")
    assert third.returncode == 0, third.stderr
    assert "validations are ranked by loss from now on" in third.stderr
    best = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)
    assert best["step"] == 40 and [step for step, _ in best["validation_loss"]] == [40]

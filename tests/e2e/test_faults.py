"""Numerical faults, checkpoint retention and accepted config changes on resume."""

import math

import torch

from transformer_mt.checkpoint import load_checkpoint, rotate
from transformer_mt.cli import main
from transformer_mt.model import Transformer


def _nan_on_calls(monkeypatch, bad_calls):
    real = Transformer.loss
    calls = {"n": 0}

    def maybe_nan(*args, **kwargs):
        calls["n"] += 1
        loss = real(*args, **kwargs)
        return loss * math.nan if calls["n"] in bad_calls else loss
    monkeypatch.setattr(Transformer, "loss", maybe_nan)


def test_a_non_finite_step_is_skipped_and_counted(tmp_path, tiny_config, monkeypatch):
    _nan_on_calls(monkeypatch, bad_calls={2})       # the second training batch
    run_dir = tmp_path / "run"
    assert main(["train", "--config", str(tiny_config), "--run-dir", str(run_dir)]) == 0
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert state["step"] == 6 and state["skipped_steps"] == 1 and state["bad_steps"] == 0
    assert all(torch.isfinite(p).all() for p in state["model"].values())
    assert "non-finite loss, update skipped" in (run_dir / "train.log").read_text()


def test_repeated_faults_stop_the_run_naming_the_last_good_checkpoint(tmp_path, tiny_config,
                                                                      monkeypatch, capsys):
    _nan_on_calls(monkeypatch, bad_calls=set(range(4, 1000)))
    run_dir = tmp_path / "run"
    code = main(["train", "--config", str(tiny_config), "--run-dir", str(run_dir),
                 "--set", "train.max_bad_steps=2", "--max-steps", "50"])
    assert code == 1
    err = capsys.readouterr().err
    assert "2 consecutive steps up to step 5" in err and "checkpoints/last.pt" in err
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert state["step"] == 3          # the last checkpoint before the faults, untouched


def test_safe_config_changes_on_resume_are_accepted_and_logged(tmp_path, tiny_config):
    run_dir = tmp_path / "run"
    assert main(["train", "--config", str(tiny_config), "--run-dir", str(run_dir)]) == 0
    assert main(["train", "--config", str(tiny_config), "--run-dir", str(run_dir), "--resume",
                 "--max-steps", "8", "--set", "train.lr=0.001",
                 "--set", "train.valid_every=7"]) == 0
    text = (run_dir / "train.log").read_text()
    assert "train.lr changed from 0.003 to 0.001" in text
    assert "train.valid_every changed from 5 to 7" in text
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["config"]["train"]["lr"] == 0.001


def test_resuming_a_decayed_run_with_more_steps_warns_that_the_rate_jumps(tmp_path, tiny_config,
                                                                        capsys):
    run_dir = tmp_path / "run"
    train = ["train", "--config", str(tiny_config), "--run-dir", str(run_dir)]
    assert main([*train, "--set", "train.decay_steps=3"]) == 0          # max_steps 6
    capsys.readouterr()
    assert main([*train, "--resume", "--max-steps", "9", "--set", "train.decay_steps=3"]) == 0
    err = capsys.readouterr().err
    assert "the learning rate had decayed to" in err and "by step 6" in err
    assert "resume from a checkpoint taken before its decay began" in err
    # Adding a decay to a run that had none, or keeping the schedule, says nothing.
    plain = tmp_path / "plain"
    assert main(["train", "--config", str(tiny_config), "--run-dir", str(plain)]) == 0
    assert main(["train", "--config", str(tiny_config), "--run-dir", str(plain), "--resume",
                 "--max-steps", "9", "--set", "train.decay_steps=3"]) == 0
    assert "decayed to" not in capsys.readouterr().err
    assert "decayed to" not in (plain / "train.log").read_text()


def test_rotation_keeps_newest_and_best(tmp_path):
    for step in (10, 20, 30, 40, 50):
        (tmp_path / f"step{step:08d}.pt").write_text("x")
    rotate(tmp_path, keep_last=2, keep_best=2, scores={10: 5.0, 20: 9.0, 30: 7.0, 40: 1.0})
    kept = sorted(int(p.stem[4:]) for p in tmp_path.glob("step*.pt"))
    assert kept == [20, 30, 40, 50]

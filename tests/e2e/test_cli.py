"""End to end through the real `tmt` command: train, resume, translate, and bad input."""

import torch
from conftest import run_tmt, tiny_config_text


def _one_error_line(result):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert lines and lines[-1].startswith("tmt: error: "), result.stderr
    return lines[-1]


def test_train_resume_translate(tmp_path, tiny_config):
    run_dir = tmp_path / "run"
    first = run_tmt("train", "--config", str(tiny_config), "--run-dir", str(run_dir))
    assert first.returncode == 0, first.stderr
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "last.pt").is_file() and (checkpoints / "best.pt").is_file()
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "tokenizers" / "src.json").is_file()
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    state = torch.load(checkpoints / "last.pt", weights_only=True)
    assert state["step"] == 6
    # No "scheduler": the learning rate is a function of the step (train_step.learning_rate).
    for key in ("model", "optimizer", "rng", "epoch", "config", "vocab"):
        assert key in state

    again = run_tmt("train", "--config", str(tiny_config), "--run-dir", str(run_dir), "--resume")
    assert again.returncode == 0 and "already reached step 6" in again.stderr

    more = run_tmt("train", "--config", str(tiny_config), "--run-dir", str(run_dir), "--resume",
                   "--max-steps", "9")
    assert more.returncode == 0, more.stderr
    assert "resumed" in more.stderr
    assert torch.load(checkpoints / "last.pt", weights_only=True)["step"] == 9

    args = run_tmt("translate", "--run", str(run_dir), "I love reading books.", "",
                   "Where is the station?")
    assert args.returncode == 0, args.stderr
    lines = args.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""

    piped = run_tmt("translate", "--checkpoint", str(checkpoints / "best.pt"),
                    stdin="I love reading books.\n\nWhere is the station?\n")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == args.stdout

    latest = run_tmt("translate", "--runs-dir", str(tmp_path), "Good morning.")
    assert latest.returncode == 0 and latest.stdout.count("\n") == 1


def test_starting_over_an_existing_run_is_refused(tmp_path, tiny_config):
    run_dir = tmp_path / "run"
    assert run_tmt("train", "--config", str(tiny_config), "--run-dir", str(run_dir),
                   "--max-steps", "1").returncode == 0
    result = run_tmt("train", "--config", str(tiny_config), "--run-dir", str(run_dir))
    assert result.returncode != 0 and "--resume" in _one_error_line(result)


def test_resume_refuses_a_changed_model_shape(tmp_path, tiny_config):
    run_dir = tmp_path / "run"
    assert run_tmt("train", "--config", str(tiny_config), "--run-dir", str(run_dir),
                   "--max-steps", "1").returncode == 0
    result = run_tmt("train", "--config", str(tiny_config), "--run-dir", str(run_dir),
                     "--resume", "--max-steps", "2", "--set", "model.d_model=64")
    assert result.returncode != 0 and "model.d_model" in _one_error_line(result)


def test_bad_input_gives_one_clear_line(tmp_path, corpus_tsv):
    bad_key = tmp_path / "bad_key.yaml"
    bad_key.write_text(tiny_config_text(corpus_tsv).replace("  d_ff: 64", "  d_fff: 64"))
    wrong_type = tmp_path / "wrong_type.yaml"
    wrong_type.write_text(tiny_config_text(corpus_tsv).replace("lr: 0.003", "lr: fast"))
    no_corpus = tmp_path / "no_corpus.yaml"
    no_corpus.write_text(tiny_config_text(tmp_path / "missing.tsv"))
    hub = tmp_path / "hub.yaml"
    hub.write_text("data:\n  source: hub\n")
    cases = [
        (["train", "--config", str(tmp_path / "nope.yaml")], "config file not found"),
        (["train", "--config", str(bad_key)], "did you mean 'd_ff'"),
        (["train", "--config", str(wrong_type)], "train.lr: must be a number"),
        (["train", "--config", str(no_corpus), "--run-dir", str(tmp_path / "r1")],
         "corpus file not found"),
        (["train", "--config", str(hub), "--run-dir", str(tmp_path / "r2")],
         "data.source=tsv"),
        (["train", "--config", str(bad_key), "--set", "model.layers"], "section.key=value"),
        (["train", "--resume", "--config", str(no_corpus), "--run-dir", str(tmp_path / "r3")],
         "nothing to resume"),
        (["translate", "--runs-dir", str(tmp_path / "empty"), "Hello."], "no trained run"),
        (["translate", "--checkpoint", str(tmp_path / "missing.pt"), "Hello."],
         "checkpoint not found"),
    ]
    for args, expected in cases:
        result = run_tmt(*args)
        assert result.returncode != 0, args
        assert expected in _one_error_line(result), (args, result.stderr)


def test_corrupt_checkpoint_is_reported(tmp_path):
    bad = tmp_path / "last.pt"
    bad.write_bytes(b"\x80\x04 not really a checkpoint")
    result = run_tmt("translate", "--checkpoint", str(bad), "Hello.")
    assert result.returncode != 0 and "corrupt or truncated" in _one_error_line(result)

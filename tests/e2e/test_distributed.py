"""Data-parallel training under torchrun with gloo on CPU (2 processes on this machine)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_tmt, tiny_config_text

STEPS = 12


def torchrun(*args: str, nproc: int = 2, script: list[str] | None = None,
             timeout: float = 400) -> subprocess.CompletedProcess:
    target = script or ["-m", "transformer_mt"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={nproc}", *target, *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture
def ddp_config(tmp_path, corpus_tsv) -> Path:
    path = tmp_path / "ddp.yaml"
    # device cpu: gloo, as on a machine without GPUs, also where there is one (two processes
    # cannot each have their own GPU on a one-GPU machine).
    path.write_text(tiny_config_text(corpus_tsv, max_steps=STEPS, valid_every=6,
                                     checkpoint_every=4, threads=1, device="cpu"))
    return path


def _state(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def _valid_losses(run_dir: Path) -> list[float]:
    text = (run_dir / "train.log").read_text()
    return [float(x) for x in re.findall(r"validation at step \d+: loss ([\d.]+)", text)]


@pytest.fixture
def ddp_run(tmp_path, ddp_config) -> Path:
    run_dir = tmp_path / "ddp"
    result = torchrun("train", "--config", str(ddp_config), "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr
    return run_dir


def test_two_processes_train_in_step(ddp_run):
    state = _state(ddp_run)
    assert state["step"] == STEPS and state["world_size"] == 2
    checksums = state["rank_parameter_checksums"]
    assert len(checksums) == 2 and checksums[0] == checksums[1]
    losses = _valid_losses(ddp_run)
    assert len(losses) == 2 and losses[-1] < losses[0]
    assert len(list((ddp_run / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert (ddp_run / "checkpoints" / "best.pt").is_file()


def test_two_ranks_equal_one_process_with_the_same_tokens(tmp_path, ddp_config):
    # Rank r takes batches r, r+2, ... of the same plan; one process accumulating 2 batches
    # per step sees exactly the same tokens, so the models agree up to float rounding.
    # Five steps use 10 batches, within the first epoch (at an epoch's end a lone last batch
    # is accumulated by one process but dropped by two ranks, which must get equal shares).
    no_dropout = ["--set", "model.dropout=0.0", "--max-steps", "5"]
    two = tmp_path / "two"
    result = torchrun("train", "--config", str(ddp_config), "--run-dir", str(two), *no_dropout)
    assert result.returncode == 0, result.stderr
    one = tmp_path / "one"
    result = run_tmt("train", "--config", str(ddp_config), "--run-dir", str(one), *no_dropout,
                     "--set", "train.accumulate=2")
    assert result.returncode == 0, result.stderr
    a, b = _state(two)["model"], _state(one)["model"]
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-5, rtol=1e-4), name


def test_interrupted_and_resumed_under_torchrun_equals_unbroken(tmp_path, ddp_config, ddp_run):
    run_dir = tmp_path / "halves"
    first = torchrun("train", "--config", str(ddp_config), "--run-dir", str(run_dir),
                     "--max-steps", "7")
    assert first.returncode == 0, first.stderr
    second = torchrun("train", "--config", str(ddp_config), "--run-dir", str(run_dir),
                      "--resume")
    assert second.returncode == 0, second.stderr
    a, b = _state(run_dir)["model"], _state(ddp_run)["model"]
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # A different number of processes would change the batch plan: refused, clearly.
    alone = run_tmt("train", "--config", str(ddp_config), "--run-dir", str(run_dir),
                    "--resume", "--max-steps", str(STEPS + 2))
    assert alone.returncode != 0 and "--nproc_per_node=2" in alone.stderr
    assert "Traceback" not in alone.stderr


def test_a_failing_rank_fails_the_whole_job(tmp_path, ddp_config):
    script = tmp_path / "fail_on_rank_1.py"
    script.write_text(
        "import os, sys\n"
        "from transformer_mt.cli import main\n"
        "argv = sys.argv[1:]\n"
        "if os.environ['RANK'] == '1':\n"
        "    argv = ['train', '--config', 'does-not-exist.yaml']\n"
        "sys.exit(main(argv))\n")
    result = torchrun("train", "--config", str(ddp_config), "--run-dir", str(tmp_path / "r"),
                      script=[str(script)], timeout=300)
    assert result.returncode != 0
    assert "config file not found: does-not-exist.yaml" in result.stderr


def test_more_ranks_than_gpus_is_one_clear_error(monkeypatch):
    """On a machine with one GPU, `torchrun --nproc_per_node=2` gives rank 1 no GPU of its own:
    it is refused before CUDA's "invalid device ordinal" traceback."""
    from transformer_mt.distributed import init_distributed
    from transformer_mt.errors import TmtError

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(TmtError, match=r"1 CUDA device\(s\).*--nproc_per_node=1.*device: cpu"):
        init_distributed("auto")

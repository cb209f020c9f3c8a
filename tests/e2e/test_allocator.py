"""`tmt train` runs on tcmalloc when it is installed (scripts/setup.sh installs it where it can),
on glibc's malloc when TMT_ALLOCATOR=system, and trains the same model either way."""

import torch
from conftest import run_tmt

from transformer_mt.allocator import find_tcmalloc


def _weights(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]


def test_tmt_train_runs_on_tcmalloc_when_found_and_the_model_does_not_depend_on_it(
        tmp_path, tiny_config):
    default = tmp_path / "default"
    result = run_tmt("train", "--config", str(tiny_config), "--run-dir", str(default))
    assert result.returncode == 0, result.stderr
    expected = "tcmalloc" if find_tcmalloc() else "glibc malloc"
    assert f"memory allocator: {expected}" in (default / "train.log").read_text()

    system = tmp_path / "system"
    result = run_tmt("train", "--config", str(tiny_config), "--run-dir", str(system),
                     env={"TMT_ALLOCATOR": "system"})
    assert result.returncode == 0, result.stderr
    assert "memory allocator: glibc malloc\n" in (system / "train.log").read_text()
    a, b = _weights(default), _weights(system)
    assert all(torch.equal(a[name], b[name]) for name in a)

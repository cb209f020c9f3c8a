import os
import random

import numpy as np
import pytest
import torch

from transformer_mt.checkpoint import atomic_save, load_checkpoint, rng_state, rotate, set_rng_state
from transformer_mt.errors import TmtError


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_checkpoint_that_runs_code_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "config": {}, "payload": _Exploit()}, path)
    with pytest.raises(TmtError, match="refused to load.*system"):
        load_checkpoint(path)


def test_truncated_checkpoint_is_reported_as_corrupt(tmp_path):
    path = tmp_path / "last.pt"
    atomic_save({"model": {"w": torch.ones(1000)}, "config": {}}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TmtError, match="corrupt or truncated"):
        load_checkpoint(path)


def test_atomic_save_leaves_no_temporary_files_and_loads_safely(tmp_path):
    path = tmp_path / "ck" / "last.pt"
    atomic_save({"model": {"w": torch.arange(3)}, "config": {"a": 1}}, path)
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]
    assert load_checkpoint(path)["model"]["w"].tolist() == [0, 1, 2]


def test_checkpoints_get_the_permissions_of_any_new_file(tmp_path):
    for umask, mode in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
        previous = os.umask(umask)
        try:
            atomic_save({"model": {}, "config": {}}, tmp_path / "c.pt")
        finally:
            os.umask(previous)
        assert (tmp_path / "c.pt").stat().st_mode & 0o777 == mode


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    atomic_save({"model": {"w": torch.zeros(2)}, "config": {}}, path)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(TmtError, match="No space left.*previous checkpoint is untouched"):
        atomic_save({"model": {"w": torch.ones(2)}, "config": {}}, path)
    monkeypatch.undo()
    assert load_checkpoint(path)["model"]["w"].tolist() == [0, 0]
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_random_state_round_trips_through_a_safe_checkpoint(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    atomic_save({"model": {}, "config": {}, "rng": rng_state()}, tmp_path / "s.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(load_checkpoint(tmp_path / "s.pt")["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_rotate_keeps_the_newest_step_files(tmp_path):
    for step in (5, 10, 15):
        (tmp_path / f"step{step:08d}.pt").write_text("x")
    (tmp_path / "last.pt").write_text("x")
    rotate(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step00000010.pt",
                                                          "step00000015.pt"]

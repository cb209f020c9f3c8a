import os
import random

import numpy as np
import pytest
import torch

from transformer_mt.checkpoint import (
    atomic_save,
    load_checkpoint,
    remove_partial_writes,
    rng_state,
    rotate,
    set_rng_state,
)
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


def test_a_packed_training_checkpoint_unpacks_to_the_same_fields(tmp_path):
    from transformer_mt.checkpoint import Checkpoint, TrainState, read_checkpoint, save

    train = TrainState(step=7, epoch=1, batch_in_epoch=3, best_metric="bleu", best_step=5,
                       validation_bleu={5: 2.5, 7: 1.0}, validation_loss={5: 3.0, 7: 2.9},
                       bad_steps=0, skipped_steps=2)
    ranks = [rng_state(), rng_state()]
    written = Checkpoint(model={"w": torch.arange(3.0)}, config={"name": "x"},
                         tokenizers={"src": "s", "tgt": "t"}, vocab={"src": 4, "tgt": 5},
                         step=7, epoch=1, train=train, optimizer={"state": {}, "param_groups": []},
                         rng_ranks=ranks, rank_parameter_checksums=[1.0, 1.0])
    save(written, tmp_path / "c.pt")
    read = read_checkpoint(tmp_path / "c.pt")
    assert read.train == train and read.train.updates == 5 and read.world_size == 2
    assert (read.step, read.epoch, read.vocab, read.tokenizers) == (7, 1, written.vocab,
                                                                    written.tokenizers)
    assert torch.equal(read.rng_ranks[1]["torch"], ranks[1]["torch"])
    assert read.averaged_from is None


@pytest.mark.parametrize("metric", ["loss", "bleu"])
def test_a_non_finite_validation_score_is_never_the_best(metric):
    from transformer_mt.checkpoint import TrainState

    state = TrainState(step=4, best_metric=metric)
    assert not state.record_validation(float("nan"), float("nan")) and state.best_step == 0
    assert state.record_validation(5.0, 0.0) and state.best_step == 4
    state.step = 8
    assert not state.record_validation(5.0, 0.0)      # equal is not better: the earlier stays
    assert state.validation_bleu == {4: 0.0, 8: 0.0} and state.validation_loss == {4: 5.0, 8: 5.0}


@pytest.mark.parametrize("metric, best", [("loss", 20), ("bleu", 10)])
def test_the_best_validation_is_the_lowest_loss_or_the_highest_bleu(metric, best):
    from transformer_mt.checkpoint import TrainState

    state = TrainState(best_metric=metric)
    for step, loss, bleu in ((10, 2.5, 30.0), (20, 2.2, 29.0), (30, 2.3, 28.0)):
        state.step = step
        state.record_validation(loss, bleu)
    assert state.best_step == best
    assert max(state.scores(), key=state.scores().get) == best   # what keep_best/--best rank by
    assert f"step {best} (by {metric})" in state.describe_best()


def test_a_new_best_metric_on_resume_lets_the_next_validation_replace_best_pt():
    from transformer_mt.checkpoint import TrainState

    state = TrainState(best_metric="bleu", step=10)
    state.record_validation(2.0, 30.0)
    assert not state.rank_by("bleu") and state.best_step == 10
    assert state.rank_by("loss") and state.best_step == 0
    state.step = 20
    assert state.record_validation(2.4, 25.0) and state.best_step == 20   # worse on both


def test_losses_under_another_label_smoothing_are_not_compared_with_new_ones():
    from transformer_mt.checkpoint import TrainState

    state = TrainState(step=10)
    state.record_validation(2.0, 30.0)
    assert state.rank_by("loss", losses_comparable=True) is False and state.best_step == 10
    assert state.rank_by("loss", losses_comparable=False) and state.best_step == 0
    assert state.validation_loss == {} and state.validation_bleu == {10: 30.0}
    state.step = 20
    assert state.record_validation(2.5, 29.0) and state.best_step == 20   # a higher loss
    # BLEU does not depend on the smoothing: ranking by it goes on.
    state = TrainState(step=10, best_metric="bleu")
    state.record_validation(2.0, 30.0)
    assert not state.rank_by("bleu", losses_comparable=False) and state.best_step == 10


def test_a_checkpoint_from_before_best_metric_resumes_ranked_by_bleu():
    """Checkpoints written before train.best_metric hold BLEU scores only; they stay
    resumable, and their best.pt was chosen by BLEU."""
    from transformer_mt.checkpoint import unpack

    old = {"model": {}, "config": {}, "step": 10, "epoch": 0, "batch_in_epoch": 10,
           "best_bleu": 31.0, "best_step": 10, "validation_bleu": [[10, 31.0]], "bad_steps": 0,
           "skipped_steps": 0, "optimizer": {}, "rng": {}}
    train = unpack(old).train
    assert train is not None and train.best_metric == "bleu" and train.best_step == 10
    assert train.scores() == {10: 31.0} and train.validation_loss == {}


def test_a_checkpoint_without_the_full_training_state_has_none_to_resume_from():
    from transformer_mt.checkpoint import unpack

    partial = unpack({"model": {}, "config": {}, "step": 10, "optimizer": {"unused": 1}})
    assert partial.train is None and partial.optimizer is None and partial.step == 10


def test_leftovers_of_killed_writers_are_removed_and_nothing_else(tmp_path):
    """What a process killed mid-write leaves (atomic_save's temporary, check_writable's probe)
    goes at the next start; a live process's probe and the user's own files stay."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    leftovers = [tmp_path / ".last.pt.123.ab12cd34.tmp", tmp_path / f".write-test.{dead}.tmp"]
    kept = [tmp_path / f".write-test.{os.getpid()}.tmp", tmp_path / "notes.tmp",
            tmp_path / "step00000010.pt"]
    for path in leftovers + kept:
        path.write_bytes(b"x")
    remove_partial_writes(tmp_path)
    assert sorted(tmp_path.iterdir()) == sorted(kept)


def test_checkpoints_are_ranked_best_first_the_earlier_of_equals_first_without_nan():
    from transformer_mt.checkpoint import best_first

    assert best_first({10: 5.0, 20: 9.0, 30: float("nan"), 40: 9.0, 50: -1.0}) == [20, 40, 10, 50]

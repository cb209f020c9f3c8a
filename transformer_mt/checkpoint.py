"""Checkpoints: the one checkpoint schema (`Checkpoint`, `TrainState`, `pack`/`unpack`), atomic
writes, safe loading, rotation, and the random state for exact resume.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so that it loads with
`torch.load(weights_only=True)`, which refuses pickled code. Only this module knows its keys:
everything else reads a checkpoint through `read_checkpoint`/`unpack`.
"""

from __future__ import annotations

import math
import os
import pickle
import random
import re
import secrets
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from .errors import TmtError

if TYPE_CHECKING:
    from .config import Config
    from .tokenizer import TextCodec


# --------------------------------------------------------------------------- schema

@dataclass
class TrainState:
    """The trainer's counters: where it is in the data, how validation went, numerical faults.
    Everything else a resume needs is the model, the optimizer and the random states."""

    step: int = 0                 # steps taken, skipped ones included
    epoch: int = 0                # full passes over the training pairs
    batch_in_epoch: int = 0       # batches of the current epoch already used
    best_metric: str = "loss"     # what best.pt, train.patience and train.keep_best rank by
    best_step: int = 0            # 0: no validation with a finite score yet
    validation_bleu: dict[int, float] = field(default_factory=dict)   # step -> BLEU
    validation_loss: dict[int, float] = field(default_factory=dict)   # step -> loss per token
    bad_steps: int = 0            # consecutive steps skipped for a non-finite loss/gradient
    skipped_steps: int = 0

    @property
    def updates(self) -> int:
        """Optimizer updates applied so far: the learning rate is a function of this count."""
        return self.step - self.skipped_steps

    def scores(self) -> dict[int, float]:
        """Each validation's score under `best_metric`, higher is better (loss negated)."""
        if self.best_metric == "bleu":
            return self.validation_bleu
        return {step: -loss for step, loss in self.validation_loss.items()}

    def record_validation(self, loss: float, bleu: float) -> bool:
        """Note a validation at the current step; True if it is a new best."""
        self.validation_loss[self.step], self.validation_bleu[self.step] = loss, bleu
        scores = self.scores()
        if not scores[self.step] > scores.get(self.best_step, -math.inf):
            return False                     # (a NaN score is never the best)
        self.best_step = self.step
        return True

    def rank_by(self, metric: str, losses_comparable: bool = True) -> bool:
        """Rank validations by `metric` from now on. When it changes (a resume with another
        train.best_metric), or when it is the loss and the losses so far were measured with
        another label smoothing, best.pt was chosen by another yardstick: the next validation
        replaces it. True if so."""
        if metric == self.best_metric and (metric != "loss" or losses_comparable):
            return False
        if not losses_comparable:
            self.validation_loss.clear()      # nor may train.keep_best rank by them
        self.best_metric, self.best_step = metric, 0
        return True

    def describe_best(self) -> str:
        """The best validation in words, e.g. "step 9000 (by loss): loss 1.944, BLEU 43.04"."""
        if not self.best_step:
            return "none with a finite score yet"
        return (f"step {self.best_step} (by {self.best_metric}): loss "
                f"{self.validation_loss.get(self.best_step, math.nan):.3f}, BLEU "
                f"{self.validation_bleu.get(self.best_step, math.nan):.2f}")

    def state_dict(self) -> dict:
        return {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                "best_metric": self.best_metric, "best_step": self.best_step,
                "validation_bleu": [[step, bleu] for step, bleu in self.validation_bleu.items()],
                "validation_loss": [[step, loss] for step, loss in self.validation_loss.items()],
                "bad_steps": self.bad_steps, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.epoch = state["step"], state["epoch"]
        self.batch_in_epoch = state["batch_in_epoch"]
        # Checkpoints written before train.best_metric ranked by BLEU and kept no losses.
        self.best_metric = state.get("best_metric", "bleu")
        self.best_step = state["best_step"]
        self.validation_bleu = {int(step): bleu for step, bleu in state["validation_bleu"]}
        self.validation_loss = {int(step): loss for step, loss in state.get("validation_loss", [])}
        self.bad_steps, self.skipped_steps = state["bad_steps"], state["skipped_steps"]


@dataclass
class Checkpoint:
    """A checkpoint, unpacked. Every checkpoint holds the weights, the resolved config and the
    tokenizers (all a translator needs); a training checkpoint (last.pt, best.pt, stepN.pt) also
    holds what an exact resume needs; an averaged one, the files it was averaged from."""

    model: dict[str, torch.Tensor]
    config: dict                          # the resolved config, as Config.to_dict() wrote it
    tokenizers: dict[str, str]            # "src"/"tgt" -> the serialised tokenizer
    vocab: dict[str, int]                 # "src"/"tgt" -> vocabulary size
    step: int | None = None
    epoch: int | None = None
    train: TrainState | None = None       # training checkpoints only, as the next four
    optimizer: dict | None = None
    rng_ranks: list[dict] | None = None   # each rank's random states
    rank_parameter_checksums: list[float] | None = None
    averaged_from: list[dict] | None = None

    @property
    def world_size(self) -> int:
        return len(self.rng_ranks) if self.rng_ranks else 1

    def settings(self, where: str) -> Config:
        """The config it was trained with; `where` names the checkpoint in errors."""
        from .config import config_from_dict
        return config_from_dict(self.config, where)

    def codecs(self) -> tuple[TextCodec, TextCodec]:
        """The source and target tokenizers it was trained with."""
        from .tokenizer import TextCodec
        return TextCodec.from_str(self.tokenizers["src"]), TextCodec.from_str(self.tokenizers["tgt"])


def training_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        train: TrainState, cfg: Config, src_codec: TextCodec,
                        tgt_codec: TextCodec, rng_ranks: list[dict],
                        checksums: list[float] | None = None) -> Checkpoint:
    return Checkpoint(model=model.state_dict(), config=cfg.to_dict(),
                      tokenizers={"src": src_codec.to_str(), "tgt": tgt_codec.to_str()},
                      vocab={"src": src_codec.vocab_size, "tgt": tgt_codec.vocab_size},
                      step=train.step, epoch=train.epoch, train=train,
                      optimizer=optimizer.state_dict(), rng_ranks=rng_ranks,
                      rank_parameter_checksums=checksums)


def pack(checkpoint: Checkpoint) -> dict:
    """The dict that is saved: flat, as it has been since the first release of the format (so
    that `torch.load` alone shows it)."""
    state: dict = {"model": checkpoint.model, "config": checkpoint.config,
                   "vocab": checkpoint.vocab, "tokenizers": checkpoint.tokenizers}
    if checkpoint.train is not None:
        state.update(checkpoint.train.state_dict())
        state["optimizer"] = checkpoint.optimizer
        state["rng"] = checkpoint.rng_ranks[0]
        state["world_size"] = checkpoint.world_size
        if checkpoint.world_size > 1:
            state["rng_ranks"] = checkpoint.rng_ranks
            state["rank_parameter_checksums"] = checkpoint.rank_parameter_checksums
    else:
        state.update({key: value for key, value in (("step", checkpoint.step),
                                                    ("epoch", checkpoint.epoch),
                                                    ("averaged_from", checkpoint.averaged_from))
                      if value is not None})
    return state


# What a training checkpoint holds beyond the weights, config and tokenizers (the keys TrainState
# added later, best_metric and validation_loss, have defaults for older checkpoints).
RESUME_KEYS = (*(key for key in TrainState().state_dict()
                 if key not in ("best_metric", "validation_loss")), "optimizer", "rng")


def unpack(state: dict) -> Checkpoint:
    """The inverse of `pack`, for a dict that load_checkpoint accepted. Checkpoints written
    before the learning rate became a function of the step also hold a "scheduler" entry:
    it is not needed (the rate follows from the step count and the config)."""
    checkpoint = Checkpoint(model=state["model"], config=state["config"],
                            tokenizers=state.get("tokenizers") or {},
                            vocab=state.get("vocab") or {}, step=state.get("step"),
                            epoch=state.get("epoch"), averaged_from=state.get("averaged_from"))
    if all(key in state for key in RESUME_KEYS):
        checkpoint.train = TrainState()
        checkpoint.train.load_state_dict(state)
        checkpoint.optimizer = state["optimizer"]
        checkpoint.rng_ranks = state.get("rng_ranks") or [state["rng"]]
        checkpoint.rank_parameter_checksums = state.get("rank_parameter_checksums")
    return checkpoint


def save(checkpoint: Checkpoint, path: Path) -> int:
    """Write `checkpoint` atomically to `path`; returns its size in bytes."""
    return atomic_save(pack(checkpoint), path)


def read_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    return unpack(load_checkpoint(path, map_location))


def atomic_save(obj: dict, path: Path) -> int:
    """Write to a temporary file in the same directory, fsync, then rename over `path`.

    A crash at any moment leaves either the old file or the new one, never a partial file.
    Returns the size in bytes."""
    # Created like any other file (mode 0666 less the umask; mkstemp would make it 0600) under a
    # name no other process uses; remove_partial_writes knows the pattern.
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise TmtError(f"cannot write checkpoint {path}: {exc.strerror or exc} ({exc.filename}); "
                       f"make {path.parent} a writable folder") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise TmtError(f"could not write checkpoint {path}: {exc.strerror or exc}; the "
                           f"previous checkpoint is untouched (free disk space and resume)") from None
        raise
    directory_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)
    return path.stat().st_size


def check_writable(directory: Path) -> None:
    """Stop at the start of a run, not at its first checkpoint, if `directory` cannot take
    checkpoints (a file in its place, a dangling link, no permission, a read-only disk)."""
    probe = directory / f".write-test.{os.getpid()}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        probe.unlink()
    except OSError as exc:
        raise TmtError(f"cannot write checkpoints to {directory}: {exc.strerror or exc}; make it "
                       f"a writable folder or choose another run with --run-dir") from None


def remove_partial_writes(directory: Path) -> None:
    """Delete temporary files that a killed process left behind mid-write (never read): only
    names that atomic_save makes (.NAME.pt.RANDOM.tmp), and check_writable's probes
    (.write-test.PID.tmp) of processes that no longer run; never another file in the folder."""
    for leftover in directory.glob(".*.pt.*.tmp"):
        leftover.unlink(missing_ok=True)
    for probe in directory.glob(".write-test.*.tmp"):
        pid = probe.name.split(".")[2]
        if pid.isdigit() and not _process_exists(int(pid)):
            probe.unlink(missing_ok=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:             # it exists, under another user
        return True
    return True


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict:
    """Load with weights_only=True: a file that would run code when unpickled is refused."""
    if not path.is_file():
        raise TmtError(f"checkpoint not found: {path}")
    corrupt = TmtError(f"{path}: corrupt or truncated checkpoint; use another one (e.g. best.pt "
                       f"or a stepNNNNNNNN.pt beside it) or start the run again")
    if not zipfile.is_zipfile(path):
        raise corrupt
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"(?:unsupported|Unsupported global:) GLOBAL ([\w.]+)", str(exc))
        if not found:
            raise corrupt from None
        raise TmtError(f"{path}: refused to load: it would import {found.group(1)}, and a tmt "
                       f"checkpoint holds only tensors and plain data (possibly a crafted file)"
                       ) from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile):
        raise corrupt from None
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise TmtError(f"{path}: not a tmt checkpoint (no model/config entries)")
    return state


RESUME_ADVICE = ("it was trained with another vocabulary or model settings, in another run; "
                 "resume it in its own run directory")


def check_fits(checkpoint: Checkpoint, model: torch.nn.Module, path: Path,
               advice: str = RESUME_ADVICE) -> None:
    """Refuse a checkpoint whose parameters do not fit `model` (names and shapes), before
    load_state_dict, whose error would be a traceback of every mismatch."""
    expected = model.state_dict()
    saved = checkpoint.model if isinstance(checkpoint.model, dict) else {}
    for name in sorted(set(expected) | set(saved)):
        if name not in saved or name not in expected:
            what = (f"it lacks parameter {name}" if name not in saved else
                    f"it holds parameter {name}, which this model does not have")
            raise TmtError(f"{path} does not fit this run's model: {what}; {advice}")
        found = tuple(getattr(saved[name], "shape", ()))
        if found != tuple(expected[name].shape):
            raise TmtError(f"{path} does not fit this run's model: {name} has shape "
                           f"{list(found)} in the checkpoint, {list(expected[name].shape)} here; "
                           f"{advice}")


def rng_state() -> dict:
    """Python, numpy and torch random states, as tensors and plain values (weights_only-safe)."""
    py_version, py_internal, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": torch.tensor(py_internal, dtype=torch.int64),
        "python_version": py_version,
        "python_gauss": py_gauss,
        "numpy_keys": torch.from_numpy(np_keys.astype(np.int64)),
        "numpy_pos": int(np_pos), "numpy_has_gauss": int(np_has_gauss),
        "numpy_gauss": float(np_gauss), "numpy_name": np_name,
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate((state["python_version"], tuple(state["python"].tolist()),
                     state["python_gauss"]))
    np.random.set_state((state["numpy_name"], state["numpy_keys"].numpy().astype(np.uint32),
                         state["numpy_pos"], state["numpy_has_gauss"], state["numpy_gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_checkpoint_name(step: int) -> str:
    return f"step{step:08d}.pt"


def best_first(scores: dict[int, float]) -> list[int]:
    """The steps with a finite score (higher is better, as TrainState.scores gives them), best
    first, the earlier of equals first (as best.pt keeps the earlier): the one ranking of
    train.keep_best and tmt average --best."""
    return sorted((step for step, score in scores.items() if math.isfinite(score)),
                  key=lambda step: (-scores[step], step))


def rotate(directory: Path, keep_last: int, keep_best: int = 0,
           scores: dict[int, float] | None = None) -> None:
    """Remove step checkpoints that are neither among the newest `keep_last` nor among the
    `keep_best` best-scoring ones (`scores`: step -> validation score, higher is better).
    last.pt and best.pt stay."""
    step_files = {int(p.stem[4:]): p for p in directory.glob("step*.pt") if p.stem[4:].isdigit()}
    keep = set(sorted(step_files)[-keep_last:]) if keep_last else set()
    keep.update([step for step in best_first(scores or {}) if step in step_files][:keep_best])
    for step, path in step_files.items():
        if step not in keep:
            path.unlink(missing_ok=True)


def human_size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{size} B"
        size /= 1024
    return f"{size:.1f} GB"

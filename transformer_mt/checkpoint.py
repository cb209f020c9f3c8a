"""Checkpoints: atomic writes, safe loading, rotation, and the random state for exact resume.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so that it loads with
`torch.load(weights_only=True)`, which refuses pickled code.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import secrets
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import TmtError


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
    names that atomic_save makes (.NAME.pt.RANDOM.tmp), never another file in the folder."""
    for leftover in directory.glob(".*.pt.*.tmp"):
        leftover.unlink(missing_ok=True)


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


def check_fits(state: dict, model: torch.nn.Module, path: Path) -> None:
    """Refuse a checkpoint whose parameters do not fit `model` (names and shapes), before
    load_state_dict, whose error would be a traceback of every mismatch."""
    expected = model.state_dict()
    saved = state["model"] if isinstance(state.get("model"), dict) else {}
    advice = ("it was trained with another vocabulary or model settings, in another run; "
              "resume it in its own run directory")
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


def rotate(directory: Path, keep_last: int, keep_best: int = 0,
           scores: dict[int, float] | None = None) -> None:
    """Remove step checkpoints that are neither among the newest `keep_last` nor among the
    `keep_best` best-scoring ones (`scores`: step -> validation BLEU). last.pt and best.pt stay."""
    step_files = {int(p.stem[4:]): p for p in directory.glob("step*.pt") if p.stem[4:].isdigit()}
    keep = set(sorted(step_files)[-keep_last:]) if keep_last else set()
    ranked = sorted((s for s in (scores or {}) if s in step_files), key=lambda s: -scores[s])
    keep.update(ranked[:keep_best])
    for step, path in step_files.items():
        if step not in keep:
            path.unlink(missing_ok=True)


def human_size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{size} B"
        size /= 1024
    return f"{size:.1f} GB"


def state_summary(state: dict[str, Any]) -> str:
    return f"step {state.get('step', '?')}, epoch {state.get('epoch', '?')}"

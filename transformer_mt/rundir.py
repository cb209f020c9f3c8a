"""The run directory: its layout, what in it is tmt's, the lock of its one writer, its identity.

    runs/<name>/
      run.json               written last once the data is prepared: what made the split
      config.yaml            resolved config of the latest start or accepted resume
      data/{train,valid,test}/   the frozen split (datasets on disk)
      data/ids/{train,valid}/    their token ids, flat arrays (token_store.py)
      tokenizers/{src,tgt}.json  (the same file twice for a joint BPE vocabulary)
      checkpoints/last.pt, best.pt, stepNNNNNNNN.pt, average_*.pt (tmt average)
      tensorboard/  eval/  train.log
      .tmt-lock              flock'ed by the process that trains the run; holds its PID
      .tmt-staging/          a preparation in progress (moved into place, run.json last)

tmt deletes or replaces only what it created. A fresh run starts only in a new or empty
directory, in a prepared run with no checkpoint yet (made with the same settings), or in one that
holds nothing but tmt's own partial state: the lock file and the staging folder, recognised by
their names. This module loads neither torch nor datasets, so `tmt train` can check the directory
and take the lock before those load.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import __version__
from .config import Config
from .errors import TmtError

LAST, BEST = "last.pt", "best.pt"
MARKER, LOCK, STAGING = "run.json", ".tmt-lock", ".tmt-staging"
STAGED = ("data", "tokenizers")       # prepared in the staging folder, then moved into the run
SPLITS = ("train", "valid", "test")
HOLDER_PID_WAIT_S = 1.0               # the holder writes its PID just after taking the lock


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def data(self) -> Path:
        return self.path / "data"

    @property
    def ids(self) -> Path:
        return self.data / "ids"

    @property
    def tokenizers(self) -> Path:
        return self.path / "tokenizers"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def last(self) -> Path:
        return self.checkpoints / LAST

    @property
    def best(self) -> Path:
        return self.checkpoints / BEST

    @property
    def marker(self) -> Path:
        return self.path / MARKER

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK

    @property
    def staging(self) -> Path:
        return self.path / STAGING


# --------------------------------------------------------------------------- identity

def _file_identity(path: str) -> dict:
    resolved = Path(path).resolve()
    try:
        stat = resolved.stat()
    except OSError:
        return {"path": str(resolved), "missing": True}
    return {"path": str(resolved), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def fingerprint(cfg: Config) -> dict:
    """What a split and its tokenizers are made from: the corpus (file path, size and
    modification time, or hub name) and every data and tokenizer setting."""
    d = cfg.data
    if d.source == "hub":
        corpus: Any = {"hub": d.hub_name, "config": d.hub_config}
    else:
        paths = [d.src_path, d.tgt_path] if d.source == "text" else [d.path]
        corpus = [_file_identity(p) for p in paths if p]
    settings = cfg.to_dict()
    return {"corpus": corpus, "data": settings["data"], "tokenizer": settings["tokenizer"]}


def read_marker(run: RunDir) -> dict | None:
    """The run's run.json, or None where preparation never finished."""
    try:
        marker = json.loads(run.marker.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TmtError(f"{run.marker} is damaged ({exc}); it records how the run's split "
                       f"was made: restore it from a backup or start a new run with --run-dir"
                       ) from None
    if not isinstance(marker, dict) or not isinstance(marker.get("fingerprint"), dict):
        raise TmtError(f"{run.marker} is not a tmt run marker; restore it from a backup or start "
                       f"a new run with --run-dir")
    return marker


def _setting_changes(saved: dict, current: dict) -> list[str]:
    changes = []
    for section in ("data", "tokenizer"):
        old, new = saved.get(section) or {}, current[section]
        changes += [f"{section}.{key} ({old.get(key)!r} -> {new[key]!r})"
                    for key in sorted(new) if old.get(key) != new[key]]
    return changes


def check_split_identity(cfg: Config, run: RunDir, marker: dict, with_corpus: bool) -> None:
    """Refuse a split made with other data or tokenizer settings than `cfg`'s (or, with
    `with_corpus`, from a corpus that changed since): training on it would contradict the
    saved config."""
    saved, current = marker["fingerprint"], fingerprint(cfg)
    changes = _setting_changes(saved, current)
    if changes:
        raise TmtError(f"{run.path} holds a split made with other settings: "
                       f"{', '.join(changes)}; restore them, or start a new run with --run-dir "
                       f"NEW_DIR")
    if with_corpus and saved.get("corpus") != current["corpus"]:
        raise TmtError(f"the corpus changed since the split in {run.path} was made "
                       f"({saved.get('corpus')} -> {current['corpus']}); start a new run with "
                       f"--run-dir NEW_DIR, or restore the corpus")


# --------------------------------------------------------------------------- ownership

def _partial_state_names(run: RunDir) -> set[str]:
    """The entries of a run directory that an interrupted preparation leaves: the lock and the
    staging folder, and, once the staging folder holds run.json (preparation finished, moving
    into place interrupted), what was already moved out of it."""
    # Links are never tmt's: through them, tmt would write or delete elsewhere.
    names = {name for name in (LOCK, STAGING) if not (run.path / name).is_symlink()}
    if (run.staging / MARKER).is_file():
        names.update(name for name in STAGED if not (run.staging / name).exists())
    return names


def check_can_train(cfg: Config, run: RunDir, resume: bool) -> None:
    """Refuse, before anything is written, a start that would take over or damage files that are
    not tmt's, or train on data other than the run's own."""
    if run.path.exists() and not run.path.is_dir():
        raise TmtError(f"{run.path} is a file, not a run directory; choose another with --run-dir")
    if resume:
        if not run.last.is_file():
            raise TmtError(f"nothing to resume: no checkpoint {run.last}; start the run without "
                           f"--resume")
        missing = [name for name in SPLITS if not (run.data / name).is_dir()]
        if missing:
            raise TmtError(f"{run.path} lacks its saved split ({', '.join(missing)} in "
                           f"{run.data}): a resumed run continues on exactly its own data and "
                           f"never splits the corpus again; restore the folder from a backup or "
                           f"start a new run with --run-dir NEW_DIR")
        marker = read_marker(run)
        if marker is not None:       # None: a run made before run.json existed
            check_split_identity(cfg, run, marker, with_corpus=False)
        return
    if run.last.is_file():
        raise TmtError(f"{run.path} already holds a run (checkpoints/last.pt); pass --resume to "
                       f"continue it or --run-dir NEW_DIR to start another")
    if not run.path.is_dir():
        return
    marker = read_marker(run)
    if marker is not None:           # prepared, never checkpointed: its split is reused
        check_split_identity(cfg, run, marker, with_corpus=True)
        return
    try:
        entries = set(os.listdir(run.path))
    except OSError as exc:
        raise TmtError(f"run directory {run.path} is not readable ({exc.strerror}); choose "
                       f"another with --run-dir") from None
    foreign = sorted(entries - _partial_state_names(run))
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise TmtError(f"{run.path} is not empty ({shown}) and is not a tmt run (no {MARKER}); "
                       f"tmt starts a run only in a new or empty directory: choose another with "
                       f"--run-dir")


# --------------------------------------------------------------------------- the lock

def _holder_pid(handle) -> str:
    deadline = time.monotonic() + HOLDER_PID_WAIT_S
    while True:
        handle.seek(0)
        text = handle.read().strip()
        if text.isdigit() or time.monotonic() > deadline:
            return text or "unknown"
        time.sleep(0.05)


@contextlib.contextmanager
def writer_lock(run: RunDir) -> Iterator[None]:
    """Hold the run's exclusive lock (fcntl.flock on .tmt-lock) until the block ends.

    The kernel drops a flock when its process dies, however it dies, so a lock left by a dead
    process blocks no one. The file itself stays: deleting it would let a newcomer lock a fresh
    file while another process still holds the old one."""
    try:
        run.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(run.lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise TmtError(f"run directory {run.path} is not writable ({exc.strerror}); choose "
                       f"another with --run-dir") from None
    with os.fdopen(fd, "r+", encoding="ascii", errors="replace") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TmtError(f"{run.path} is being trained by another tmt process (PID "
                           f"{_holder_pid(handle)}); wait for it to end or stop it, or train "
                           f"elsewhere with --run-dir") from None
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


@contextlib.contextmanager
def claim_for_training(cfg: Config, run: RunDir, resume: bool) -> Iterator[None]:
    """Check that the run may be trained, take its lock, and check again under the lock (another
    process may have changed the directory in between); hold the lock until the block ends."""
    check_can_train(cfg, run, resume)
    with writer_lock(run):
        finish_interrupted_commit(run)
        check_can_train(cfg, run, resume)
        yield


# --------------------------------------------------------------------------- preparation

def fresh_staging(run: RunDir) -> Path:
    """An empty staging folder (what an interrupted preparation left in it is tmt's: it goes)."""
    shutil.rmtree(run.staging, ignore_errors=True)
    run.staging.mkdir(parents=True)
    return run.staging


def commit_staging(run: RunDir, identity: dict) -> None:
    """Move the prepared data into the run; run.json, written last, marks it complete."""
    marker = {"tmt_version": __version__, "fingerprint": identity}
    tmp = run.staging / f"{MARKER}.tmp"
    tmp.write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    # From this rename on the preparation is complete: an interruption is rolled forward.
    os.replace(tmp, run.staging / MARKER)
    finish_interrupted_commit(run)


def finish_interrupted_commit(run: RunDir) -> None:
    """Complete moving a finished preparation into place (a no-op if there is none)."""
    if not (run.staging / MARKER).is_file():
        return
    for name in STAGED:
        if (run.staging / name).exists():
            os.replace(run.staging / name, run.path / name)
    os.replace(run.staging / MARKER, run.marker)
    shutil.rmtree(run.staging)


# --------------------------------------------------------------------------- finding runs

def latest_run(runs_dir: Path) -> Path | None:
    """The run directory whose newest checkpoint was written last."""
    candidates = [p for p in runs_dir.glob("*/checkpoints/*.pt") if p.name in (LAST, BEST)]
    if not candidates:
        return None
    return max(candidates, key=os.path.getmtime).parent.parent


CHECKPOINT_NAMES = {"best": BEST, "last": LAST}


def find_checkpoint(checkpoint: str | None, run: Path | None, runs_dir: Path) -> Path:
    """The checkpoint that `--checkpoint best|last|PATH` and `--run DIR` name: a path is taken
    as it is; otherwise the run (default: the latest under `runs_dir`) gives its best.pt or
    last.pt (default: best.pt, or last.pt before the first validation)."""
    if checkpoint is not None and checkpoint not in CHECKPOINT_NAMES:
        return Path(checkpoint)
    run_path = run if run is not None else latest_run(runs_dir)
    if run_path is None:
        raise TmtError(f"no trained run found under {runs_dir}/; train one first (tmt train "
                       f"--config configs/tiny.yaml) or pass --run DIR / --checkpoint FILE")
    names = [CHECKPOINT_NAMES[checkpoint]] if checkpoint else [BEST, LAST]
    for name in names:
        if (run_path / "checkpoints" / name).is_file():
            return run_path / "checkpoints" / name
    raise TmtError(f"{run_path} has no checkpoint {' or '.join('checkpoints/' + n for n in names)}"
                   f"; train it first")


def run_of_checkpoint(path: Path) -> RunDir | None:
    """The run directory a checkpoint file lies in (<run>/checkpoints/x.pt), if any."""
    run = RunDir(path.resolve().parent.parent)
    return run if path.resolve().parent.name == "checkpoints" and run.config.is_file() else None

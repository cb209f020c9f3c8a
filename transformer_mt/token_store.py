"""Token ids of a split on disk: one flat id array per side plus offsets, read from the page cache.

The layout of fairseq's MMapIndexedDataset and nanoGPT's `train.bin`, for pairs:

    STORE/header.json   {"format": 1, "pairs": N, "src": {"dtype", "vocab_size", "tokens"},
                         "tgt": {...}}
    STORE/src.ids       every source sentence's ids, end to end (uint16 when the vocabulary fits)
    STORE/src.offsets   int64, N + 1: sentence i is src.ids[offsets[i]:offsets[i + 1]]
    STORE/tgt.ids, STORE/tgt.offsets

Writing appends batch after batch to the files, so memory stays bounded whatever the corpus
size, into a temporary folder that is renamed to STORE only once everything is on disk: a store
that is found is complete.

Reading an example is four positioned reads (`os.pread`) from the page cache: its two offsets
and its ids on each side, a few dozen bytes. Every process that reads a store (DataLoader
workers, torchrun ranks) shares the one copy the kernel caches, as with a memory map, but no
process holds any of it: mapped, the store's pages count in the resident memory of each reader
as it touches them, and because the kernel maps page-cache folios of up to megabytes a fault,
a few thousand random examples map nearly the whole file (3,000 random reads mapped 482 of a
500 MB file here) -- which made a run's memory grow with the corpus (README, "Preparing
millions of pairs"). A read also cannot fault: a store truncated under a running job gives an
error, not a SIGBUS.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from torch.utils.data import Dataset

from .errors import TmtError

FORMAT = 1
HEADER = "header.json"
SIDES = ("src", "tgt")
# Positions an example occupies in a batch beyond its ids: [SOS] src [EOS] on the source side,
# [SOS] tgt (or tgt [EOS]) on the target side.
SPECIAL_POSITIONS = {"src": 2, "tgt": 1}
OFFSETS_CHUNK = 1 << 20          # offsets read at a time by lengths() (8 MB)
OFFSET = np.dtype(np.int64)

IdRows = Sequence[Sequence[int]]


def id_dtype(vocab_size: int) -> np.dtype:
    """The narrowest type that holds every id of the vocabulary: uint16 (half the disk and page
    cache of int32) for up to 65,536 types, which word-level and BPE vocabularies usually are."""
    return np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32)


class _SideWriter:
    """Appends one side's ids and offsets to its two files."""

    def __init__(self, folder: Path, side: str, vocab_size: int):
        self.side, self.vocab_size, self.dtype = side, vocab_size, id_dtype(vocab_size)
        self.ids = open(folder / f"{side}.ids", "wb")
        self.offsets = open(folder / f"{side}.offsets", "wb")
        self.tokens = 0
        np.zeros(1, dtype=np.int64).tofile(self.offsets)

    def append(self, rows: IdRows) -> None:
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64,
                          count=int(lengths.sum()))
        if len(ids) and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"{self.side} ids outside the vocabulary of {self.vocab_size}")
        ids.astype(self.dtype).tofile(self.ids)
        (self.tokens + np.cumsum(lengths)).tofile(self.offsets)
        self.tokens += int(lengths.sum())

    def close(self) -> dict:
        for handle in (self.ids, self.offsets):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        return {"dtype": self.dtype.name, "vocab_size": self.vocab_size, "tokens": self.tokens}


def write_token_store(path: Path, batches: Iterable[tuple[IdRows, IdRows]],
                      src_vocab_size: int, tgt_vocab_size: int) -> "TokenStore":
    """Write the (source ids, target ids) batches to a new store at `path` and open it.

    Each batch holds equally many rows per side, ids without special tokens. Only one batch is
    in memory at a time. `path` must not exist: a store is written once and never replaced."""
    path = Path(path)
    if path.exists():
        raise TmtError(f"token store {path} already exists; tmt never overwrites it (delete it "
                       f"to rebuild)")
    path.parent.mkdir(parents=True, exist_ok=True)
    # A sibling folder, so that the final rename stays on one file system and is atomic.
    partial = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        writers = {"src": _SideWriter(partial, "src", src_vocab_size),
                   "tgt": _SideWriter(partial, "tgt", tgt_vocab_size)}
        pairs = 0
        for src_rows, tgt_rows in batches:
            if len(src_rows) != len(tgt_rows):
                raise ValueError(f"a batch of {len(src_rows)} source rows and {len(tgt_rows)} "
                                 f"target rows")
            writers["src"].append(src_rows)
            writers["tgt"].append(tgt_rows)
            pairs += len(src_rows)
        header = {"format": FORMAT, "pairs": pairs,
                  **{side: writer.close() for side, writer in writers.items()}}
        with open(partial / HEADER, "w", encoding="utf-8") as handle:
            json.dump(header, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(partial, path)
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(exc, OSError):
            raise TmtError(f"could not write token store {path}: {exc.strerror or exc}") from None
        raise
    _fsync_directory(path.parent)
    return TokenStore(path)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TokenStore(Dataset):
    """A written store as a torch Dataset: item i is (src_ids, tgt_ids), two read-only numpy
    arrays of the ids without special tokens, read from the page cache.

    The files are opened lazily in each process and the open files are left out of the pickle,
    so a DataLoader worker receives a path and a header, not the corpus."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.header = _read_header(self.path)
        self._dtypes = {side: np.dtype(self.header[side]["dtype"]) for side in SIDES}
        self._files: dict[str, int] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_files": {}}

    def __del__(self):
        for fd in getattr(self, "_files", {}).values():
            os.close(fd)

    def _read(self, name: str, dtype: np.dtype, start: int, count: int) -> np.ndarray:
        """`count` items of `dtype` from file `name`, starting at item `start`."""
        size = count * dtype.itemsize
        try:
            if name not in self._files:
                self._files[name] = os.open(self.path / name, os.O_RDONLY)
            data = os.pread(self._files[name], size, start * dtype.itemsize)
        except OSError as exc:
            raise TmtError(f"cannot read token store {self.path}: {name}: "
                           f"{exc.strerror or exc}") from None
        if len(data) != size:
            raise TmtError(f"token store {self.path} is damaged: {name} ends before item "
                           f"{start + count} (delete the store to rebuild it)")
        return np.frombuffer(data, dtype=dtype)

    def __len__(self) -> int:
        return self.header["pairs"]

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= index < len(self):
            raise IndexError(f"pair {index} of a store of {len(self)}")
        src, tgt = (self._ids(side, index) for side in SIDES)
        return src, tgt

    def _ids(self, side: str, index: int) -> np.ndarray:
        start, end = self._read(f"{side}.offsets", OFFSET, index, 2).tolist()
        return self._read(f"{side}.ids", self._dtypes[side], start, end - start)

    def lengths(self) -> np.ndarray:
        """(N, 2): positions each example occupies in a batch, source and target side, from the
        offsets alone (the ids are not read), in the smallest signed type that holds them
        (int16 for any sentence under 32k tokens: 4 bytes a pair). The offsets are read a chunk
        at a time, so their 16 bytes a pair do not stay in the process after start-up."""
        out = np.empty((len(self), len(SIDES)), dtype=np.int16)
        for column, side in enumerate(SIDES):
            with open(self.path / f"{side}.offsets", "rb") as handle:
                previous = np.fromfile(handle, dtype=OFFSET, count=1)
                for start in range(0, len(self), OFFSETS_CHUNK):
                    chunk = np.fromfile(handle, dtype=OFFSET,
                                        count=min(OFFSETS_CHUNK, len(self) - start))
                    lengths = np.diff(chunk, prepend=previous) + SPECIAL_POSITIONS[side]
                    if lengths.max(initial=0) > np.iinfo(out.dtype).max:
                        out = out.astype(np.int32)        # a sentence of over 32k tokens
                    out[start:start + len(chunk), column] = lengths
                    previous = chunk[-1:]
        return out


def _read_header(path: Path) -> dict:
    """The header of a complete store, after checking that every file has the size it states."""
    try:
        header = json.loads((path / HEADER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TmtError(f"no token store at {path} (no {HEADER}: never written, or its writing "
                       f"was interrupted)") from None
    except (OSError, ValueError) as exc:
        raise TmtError(f"cannot read token store header {path / HEADER}: {exc}") from None
    found_format = header.get("format") if isinstance(header, dict) else None
    if found_format != FORMAT:
        raise TmtError(f"token store {path} has format {found_format!r}; this tmt reads "
                       f"format {FORMAT} (delete the store to rebuild it)")
    try:
        expected = {}
        for side in SIDES:
            itemsize = np.dtype(header[side]["dtype"]).itemsize
            expected[f"{side}.ids"] = int(header[side]["tokens"]) * itemsize
            expected[f"{side}.offsets"] = (int(header["pairs"]) + 1) * 8
    except (KeyError, TypeError, ValueError) as exc:
        raise TmtError(f"token store header {path / HEADER} is damaged ({exc!r}); delete the "
                       f"store to rebuild it") from None
    for name, size in expected.items():
        found = (path / name).stat().st_size if (path / name).is_file() else None
        if found != size:
            raise TmtError(f"token store {path} is damaged: {name} has "
                           f"{'no file' if found is None else f'{found} bytes'}, its header "
                           f"says {size} (delete the store to rebuild it)")
    return header

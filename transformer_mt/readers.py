"""Read a parallel corpus in any supported format into one Arrow file of pairs (`src`, `tgt`):
TSV, two line-aligned text files, JSONL / parquet (a `translation` column or one column per
language) or a Hugging Face hub dataset. Rows that are not a pair are counted, skipped and
reported by number; a file that cannot be a corpus (missing, empty, not UTF-8, a directory)
ends in one TmtError line."""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any, Iterator

import datasets

from .arrow_io import BATCH_ROWS, record_batches, texts, write_pairs
from .config import DataConfig
from .errors import TmtError
from .progress import stage
from .textio import chunks, utf8_lines

log = logging.getLogger(__name__)

HUB_HOST = "huggingface.co"
MALFORMED_LINES_SHOWN = 5


class _Skipped:
    """Rows skipped as malformed: how many, and the numbers of the first few (to show)."""

    def __init__(self):
        self.count, self.first = 0, []

    def add(self, number: int) -> None:
        self.count += 1
        if len(self.first) < MALFORMED_LINES_SHOWN:
            self.first.append(number)

    def report(self, where: str, total: int, unit: str, what: str) -> None:
        if self.count:
            more = ", ..." if self.count > MALFORMED_LINES_SHOWN else ""
            log.warning("%s: skipped %d of %d %s %s (%s %s%s)", where, self.count, total, unit,
                        what, unit, ", ".join(map(str, self.first)), more)


def _local_file(path: str | None, what: str) -> str:
    if path and Path(path).is_dir():
        raise TmtError(f"{path} ({what}) is a directory; point the config at a corpus file")
    if not path or not Path(path).is_file():
        raise TmtError(f"corpus file not found: {path} ({what}); point the config at an existing "
                       f"file, e.g. --set data.path=../shared/data/tatoeba-en-it/en-it.tsv")
    return path


def _lines(path: str, progress=None) -> Iterator[str]:
    """The UTF-8 lines of a file (see textio.utf8_lines), advancing `progress` by bytes read."""
    try:
        with open(path, "rb") as handle:
            read = 0
            for number, line in enumerate(utf8_lines(handle, path), 1):
                if progress is not None and number % BATCH_ROWS == 0:
                    progress.update(handle.tell() - read)
                    read = handle.tell()
                yield line
            if progress is not None:
                progress.update(handle.tell() - read)
    except OSError as exc:
        raise TmtError(f"cannot read {path}: {exc.strerror or exc}") from None


def _load_tsv(cfg: DataConfig, work: Path) -> datasets.Dataset:
    # Read as plain lines and split on the tab ourselves: a CSV reader would interpret the
    # quote characters that the Tatoeba file contains.
    path = _local_file(cfg.path, "data.path")
    skipped, total = _Skipped(), 0

    def batches(progress) -> Iterator[dict[str, list[str]]]:
        nonlocal total
        for lines in chunks(_lines(path, progress), BATCH_ROWS):
            src, tgt = [], []
            for number, line in enumerate(lines, total + 1):
                fields = line.split("\t")
                if len(fields) == 2:
                    src.append(fields[0])
                    tgt.append(fields[1])
                else:
                    skipped.add(number)
            total += len(lines)
            yield {"src": src, "tgt": tgt}

    with stage("reading", os.path.getsize(path), unit="B") as progress:
        ds = write_pairs(work / "corpus.arrow", batches(progress))
    if not total:
        raise TmtError(f"{path} is empty: it holds no sentences")
    skipped.report(path, total, "lines", "that are not 'source<TAB>target'")
    return ds


def _load_text_pair(cfg: DataConfig, work: Path) -> datasets.Dataset:
    src_path = _local_file(cfg.src_path, "data.src_path")
    tgt_path = _local_file(cfg.tgt_path, "data.tgt_path")
    counts = {src_path: 0, tgt_path: 0}

    def counted(path: str, progress) -> Iterator[str]:
        for line in _lines(path, progress):
            counts[path] += 1
            yield line

    def batches(progress) -> Iterator[dict[str, list[str]]]:
        pairs = itertools.zip_longest(counted(src_path, progress), counted(tgt_path, progress))
        for chunk in chunks(pairs, BATCH_ROWS):
            aligned = [(s, t) for s, t in chunk if s is not None and t is not None]
            yield {"src": [s for s, _ in aligned], "tgt": [t for _, t in aligned]}

    size = os.path.getsize(src_path) + os.path.getsize(tgt_path)
    with stage("reading", size, unit="B") as progress:
        ds = write_pairs(work / "corpus.arrow", batches(progress))
    for path, count in counts.items():
        if not count:
            raise TmtError(f"{path} is empty: it holds no sentences")
    if counts[src_path] != counts[tgt_path]:
        raise TmtError(f"{src_path} has {counts[src_path]} lines but {tgt_path} has "
                       f"{counts[tgt_path]}; the two files must be line-aligned")
    return ds


def _as_mapping(row: Any) -> dict:
    """One row of a `translation` column as a dict ({} for null or junk). When rows have
    different keys, `datasets` keeps the column as JSON text."""
    if isinstance(row, str):
        try:
            row = json.loads(row)
        except ValueError:
            return {}
    return row if isinstance(row, dict) else {}


def _from_translation_column(ds: datasets.Dataset, cfg: DataConfig, where: str,
                             work: Path) -> datasets.Dataset:
    """Accept the opus_books schema {"translation": {src: ..., tgt: ...}} or flat src/tgt columns.
    Rows without a text in both languages are skipped and reported, as malformed TSV lines are."""
    columns = ds.column_names
    nested = "translation" in columns
    if not nested and not (cfg.src_lang in columns and cfg.tgt_lang in columns):
        raise TmtError(f"{where}: expected a 'translation' column or columns '{cfg.src_lang}' and "
                       f"'{cfg.tgt_lang}', found: {', '.join(columns)}")
    if not len(ds):
        raise TmtError(f"{where} is empty: it holds no sentence pairs")
    skipped, languages = _Skipped(), set() if nested else set(columns)

    def batches(progress) -> Iterator[dict[str, list[str]]]:
        row_number = 0
        for batch in record_batches(ds):
            if nested:
                rows = [_as_mapping(row) for row in texts(batch, "translation")]
                src = [row.get(cfg.src_lang) for row in rows]
                tgt = [row.get(cfg.tgt_lang) for row in rows]
                languages.update(lang for row in rows for lang, text in row.items()
                                 if text is not None)
            else:
                src, tgt = texts(batch, cfg.src_lang), texts(batch, cfg.tgt_lang)
            good = {"src": [], "tgt": []}
            for number, (s, t) in enumerate(zip(src, tgt), row_number + 1):
                if isinstance(s, str) and isinstance(t, str):
                    good["src"].append(s)
                    good["tgt"].append(t)
                else:
                    skipped.add(number)
            row_number += len(src)
            progress.update(len(src))
            yield good

    with stage("reading", len(ds), unit="pairs") as progress:
        out = write_pairs(work / "corpus.arrow", batches(progress))
    if not len(out):
        absent = [lang for lang in (cfg.src_lang, cfg.tgt_lang) if lang not in languages]
        detail = (f"no language '{absent[0]}' in any row" if absent else
                  f"no row has a text in both '{cfg.src_lang}' and '{cfg.tgt_lang}'")
        raise TmtError(f"{where}: {detail} (the rows have: {', '.join(sorted(languages)) or 'none'}"
                       f"); set data.src_lang / data.tgt_lang")
    skipped.report(where, len(ds), "rows", f"with no text in '{cfg.src_lang}' or '{cfg.tgt_lang}'")
    return out


def _load_structured(cfg: DataConfig, builder: str, work: Path) -> datasets.Dataset:
    path = _local_file(cfg.path, "data.path")
    if os.path.getsize(path) == 0:
        raise TmtError(f"{path} is empty: it holds no sentence pairs")
    try:
        ds = datasets.load_dataset(builder, data_files=path, split="train")
    except Exception as exc:  # datasets wraps parser errors in several exception types
        cause = exc.__cause__ or exc
        raise TmtError(f"{path}: cannot read as {builder} ({type(cause).__name__}: "
                       f"{str(cause).splitlines()[0] if str(cause) else 'no detail'})") from None
    return _from_translation_column(ds, cfg, path, work)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Probe the hub in a thread so that a hanging DNS lookup cannot stall us either."""
    result = []

    def probe():
        try:
            socket.create_connection((HUB_HOST, 443), timeout=timeout).close()
            result.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return bool(result)


def _hub_offline() -> bool:
    return any(os.environ.get(var, "").lower() in ("1", "true", "yes", "on")
               for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _load_hub(cfg: DataConfig, work: Path) -> datasets.Dataset:
    alternative = ("or train from a local file: --set data.source=tsv "
                   "--set data.path=../shared/data/tatoeba-en-it/en-it.tsv")
    name = f"'{cfg.hub_name}' ({cfg.hub_config})"
    if not _hub_offline() and not _hub_reachable():
        raise TmtError(f"cannot reach the Hugging Face hub to load {name}; check the network, "
                       + alternative)
    try:
        ds = datasets.load_dataset(cfg.hub_name, cfg.hub_config, split="train")
    except Exception as exc:  # the hub client raises many types; all end the same way for us
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "BuilderConfig" in text or "config" in text.lower() and "not found" in text.lower():
            raise TmtError(f"unknown language pair '{cfg.hub_config}' for {cfg.hub_name} "
                           f"({text}); set data.hub_config") from None
        if _hub_offline():
            raise TmtError(f"cannot load {name}: the hub is switched off (HF_HUB_OFFLINE / "
                           f"HF_DATASETS_OFFLINE) and it is not cached; " + alternative) from None
        raise TmtError(f"cannot load {name} from the hub: {text}; " + alternative) from None
    return _from_translation_column(ds, cfg, cfg.hub_name, work)


def load_corpus(cfg: DataConfig, work: Path) -> datasets.Dataset:
    """The raw corpus as an Arrow file in the folder `work`, opened as a Dataset with columns
    `src` and `tgt` (not yet cleaned)."""
    datasets.disable_progress_bars()
    work.mkdir(parents=True, exist_ok=True)
    if cfg.source == "hub":
        return _load_hub(cfg, work)
    if cfg.source == "tsv":
        return _load_tsv(cfg, work)
    if cfg.source == "text":
        return _load_text_pair(cfg, work)
    return _load_structured(cfg, {"jsonl": "json", "parquet": "parquet"}[cfg.source], work)

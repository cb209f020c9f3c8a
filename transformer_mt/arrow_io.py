"""Arrow files of sentence pairs (columns `src` and `tgt`), written and read one record batch at a
time: the one way preparation, tokenizer training and the unseen-words sets read corpora and
splits of any size without holding them in memory."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import datasets
import numpy as np
import pyarrow as pa
from datasets.arrow_writer import ArrowWriter

BATCH_ROWS = 10_000
PAIR_FEATURES = datasets.Features({"src": datasets.Value("string"),
                                   "tgt": datasets.Value("string")})


def column(ds: datasets.Dataset, name: str) -> list:
    """A column as a Python list (through Arrow: much faster than iterating the Dataset); only
    for splits that fit in memory (valid, test). Read through the arrow format, not `ds.data`,
    so that a `select`ed dataset gives its selected rows, not its whole table."""
    if isinstance(ds, StreamedSplit):
        return [text for batch in sentence_batches(ds, name) for text in batch]
    return ds.with_format("arrow")[name].to_pylist()


def write_pairs(path: Path, batches: Iterable[dict[str, list[str]]]) -> datasets.Dataset:
    """Write batches of {"src": [...], "tgt": [...]} to an Arrow file, one batch in memory at
    a time, and open it as a Dataset."""
    with ArrowWriter(features=PAIR_FEATURES, path=str(path), writer_batch_size=BATCH_ROWS) as out:
        for batch in batches:
            out.write_batch(batch)
        out.finalize()
    return datasets.Dataset.from_file(str(path))


class StreamedSplit:
    """Pairs in Arrow stream files (a saved split), read one record batch at a time, never
    memory-mapped. This is how the train split, which can hold tens of millions of pairs, is
    read: opening it with datasets.load_from_disk pages the whole file into memory (read-ahead
    over the memory map: 1 GB of RSS for a 10 M-pair split, held for the life of the process),
    while the pages a stream reads stay in the page cache, not in the process."""

    def __init__(self, files: list[Path], num_rows: int | None = None):
        self.files, self._num_rows = files, num_rows

    def __len__(self) -> int:
        if self._num_rows is None:          # counted once, by reading the files through
            self._num_rows = sum(batch.num_rows for batch in self.record_batches())
        return self._num_rows

    def record_batches(self) -> Iterator[pa.RecordBatch]:
        for path in self.files:
            with pa.OSFile(str(path)) as handle:
                yield from pa.ipc.open_stream(handle)


def record_batches(ds: datasets.Dataset | StreamedSplit) -> Iterator[pa.RecordBatch]:
    """The rows of `ds` in order, one Arrow record batch at a time, read from its files as a
    stream: unlike iterating the memory-mapped Dataset, the pages read do not stay in memory."""
    if isinstance(ds, StreamedSplit):
        yield from ds.record_batches()
    elif ds._indices is None and ds.cache_files:
        yield from StreamedSplit([Path(f["filename"]) for f in ds.cache_files]).record_batches()
    else:                       # held in memory, or a selection of rows
        for table in ds.with_format("arrow").iter(BATCH_ROWS):
            yield from table.to_batches()


def texts(batch: pa.RecordBatch, name: str) -> list:
    return batch.column(batch.schema.get_field_index(name)).to_pylist()


def sentence_batches(ds: datasets.Dataset | StreamedSplit, side: str, rows: np.ndarray | None = None,
                     progress=None) -> Iterator[list[str]]:
    """One side ("src" or "tgt") of `ds` streamed as lists of sentences, one record batch at a
    time (the tokenizer trainers take a list at a time much faster than one string at a time);
    only the rows `rows` (sorted) when given."""
    start = 0
    for batch in record_batches(ds):
        side_texts = texts(batch, side)
        if rows is not None:
            here = rows[np.searchsorted(rows, start):np.searchsorted(rows, start + len(side_texts))]
            side_texts = [side_texts[i - start] for i in here.tolist()]
        start += batch.num_rows
        if progress is not None:
            progress.update(len(side_texts))
        yield side_texts


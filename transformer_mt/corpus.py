"""The corpus side of the data path: read a parallel corpus into Arrow, clean it, drop exact
duplicates, filter by length and split it without leakage, all in bounded memory.

    corpus (TSV / two text files / JSONL / parquet / hub)
      -> reading:   WORK/corpus.arrow, columns `src` and `tgt` (malformed rows counted, skipped;
                    readers.py)
      -> cleaning:  WORK/clean.arrow, normalised (or truncated) texts, row for row; 64-bit keys
                    of every pair and sentence held in numpy (26 bytes a row with two flags);
                    duplicates (same pair key) and long pairs dropped; the kept pairs' sentences
                    numbered as a graph (8 bytes a row) and the keys let go
      -> splitting: connected components of that graph dealt out to train / valid / test
                    (splitting.py decides; here each split is written as Arrow)

Every pass streams the Arrow files record batch by record batch (arrow_io.py; not memory-mapped:
pages read once are not kept), so memory grows only by the per-row arrays (at most 30 bytes a row at any
moment), not by the texts. pipeline.py takes the splits on to tokenizers and token ids.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import datasets
import numpy as np
import pyarrow as pa
from datasets.arrow_writer import ArrowWriter

from .arrow_io import PAIR_FEATURES, StreamedSplit, record_batches, texts, write_pairs
from .config import DataConfig
from .errors import TmtError
from .progress import stage
from .readers import load_corpus
from .splitting import SPLIT_NAMES, SentenceGraph, assign_splits, first_occurrences, sentence_graph
from .tokenizer import normalize_text, token_limit_end

log = logging.getLogger(__name__)

SPLIT_FILE = "data-00000-of-00001.arrow"        # the name Dataset.save_to_disk gives one shard
ARROW_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"   # what closes an Arrow IPC stream


@dataclass
class Splits:
    train: StreamedSplit          # any size: read as a stream, never memory-mapped
    valid: datasets.Dataset
    test: datasets.Dataset

    def items(self):
        return (("train", self.train), ("valid", self.valid), ("test", self.test))


# --------------------------------------------------------------------------- cleaning

def sentence_keys(sentences: list[str]) -> np.ndarray:
    """A stable 64-bit key per sentence (BLAKE2b, not Python's per-process salted `hash`), so
    that a split is the same in every process. Two different sentences share a key with
    probability ~n²/2⁶⁵ (1e-8 for Tatoeba); a collision only joins two components."""
    digests = b"".join(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest()
                       for s in sentences)
    return np.frombuffer(digests, dtype="<u8").copy()


@dataclass
class CleanBatch:
    """One batch of pairs cleaned, row for row: texts normalised (truncated when
    data.long_sentences is `truncate`), with what the decision which rows to keep needs."""
    src: list[str]
    tgt: list[str]
    empty: np.ndarray         # bool: a side is empty after normalisation
    too_long: np.ndarray      # bool: a side has more than data.max_len tokens
    pair_keys: np.ndarray     # uint64 of the normalised pair, before truncation (duplicates)
    src_keys: np.ndarray      # uint64 of the texts kept (the split joins pairs by these)
    tgt_keys: np.ndarray


def clean_batch(src: list, tgt: list, cfg: DataConfig) -> CleanBatch:
    """Tokens are counted as the word-level tokenizer splits text (a run of 30,000 punctuation
    marks is 30,000 tokens, not one word), so no pair kept encodes to more than max_len
    word-level tokens."""
    out_src, out_tgt, pairs, empty, too_long = [], [], [], [], []
    for s, t in zip(src, tgt):
        s, t = normalize_text(s or ""), normalize_text(t or "")
        # normalize_text turns every control character into a space: NUL cannot occur in s.
        pairs.append(f"{s}\0{t}")
        empty.append(not s or not t)
        s_end, t_end = token_limit_end(s, cfg.max_len), token_limit_end(t, cfg.max_len)
        too_long.append(s_end is not None or t_end is not None)
        if too_long[-1] and cfg.long_sentences == "truncate":
            s, t = s[:s_end].rstrip(), t[:t_end].rstrip()
        out_src.append(s)
        out_tgt.append(t)
    return CleanBatch(out_src, out_tgt, np.array(empty, dtype=bool),
                      np.array(too_long, dtype=bool), sentence_keys(pairs),
                      sentence_keys(out_src), sentence_keys(out_tgt))


def kept_mask(empty: np.ndarray, too_long: np.ndarray, pair_keys: np.ndarray,
              cfg: DataConfig) -> np.ndarray:
    """Mask of the pairs to keep: empty pairs dropped, of exact duplicates only the first
    occurrence, and pairs longer than max_len filtered (or kept truncated). `empty` and
    `too_long` serve as scratch space (their contents are lost): no copy of either is made."""
    read, usable = len(empty), len(empty) - int(empty.sum())
    kept = first_occurrences(pair_keys, np.logical_not(empty, out=empty))
    distinct = int(kept.sum())
    long = np.logical_and(too_long, kept, out=too_long)
    if cfg.long_sentences == "filter":
        kept[long] = False
    action = "dropped" if cfg.long_sentences == "filter" else "truncated"
    log.info("corpus: %d pairs read, %d empty dropped, %d duplicates dropped, %d longer than %d "
             "tokens %s, %d kept", read, read - usable, usable - distinct, int(long.sum()),
             cfg.max_len, action, int(kept.sum()))
    return kept


def clean_pairs(src: list[str], tgt: list[str], cfg: DataConfig) -> tuple[list[str], list[str]]:
    """Normalise, drop empty pairs, dedupe exact pairs, then filter or truncate pairs with more
    than `cfg.max_len` tokens on a side: `clean_corpus` on pairs held in lists."""
    cleaned = clean_batch(src, tgt, cfg)
    rows = np.flatnonzero(kept_mask(cleaned.empty, cleaned.too_long, cleaned.pair_keys, cfg))
    return [cleaned.src[i] for i in rows], [cleaned.tgt[i] for i in rows]


@dataclass
class CleanCorpus:
    pairs: datasets.Dataset   # every corpus row cleaned (WORK/clean.arrow), kept or not
    graph: SentenceGraph      # the kept rows' sentences as nodes (splitting.py), per corpus row


def clean_corpus(raw: datasets.Dataset, cfg: DataConfig, work: Path) -> CleanCorpus:
    """`clean_pairs` over a corpus of any size, in batches; then the seeded sample of
    data.max_pairs, and the kept pairs' sentence graph."""
    # Filled batch by batch: 26 bytes a pair, the most per-pair memory preparation holds.
    arrays = {name: np.zeros(len(raw), dtype=bool) for name in ("empty", "too_long")}
    arrays.update({name: np.zeros(len(raw), dtype=np.uint64)
                   for name in ("pair_keys", "src_keys", "tgt_keys")})

    def batches(progress) -> Iterator[dict[str, list[str]]]:
        start = 0
        for batch in record_batches(raw):
            cleaned = clean_batch(texts(batch, "src"), texts(batch, "tgt"), cfg)
            for name, array in arrays.items():
                array[start:start + batch.num_rows] = getattr(cleaned, name)
            start += batch.num_rows
            progress.update(batch.num_rows)
            yield {"src": cleaned.src, "tgt": cleaned.tgt}

    with stage("cleaning", len(raw)) as progress:
        pairs = write_pairs(work / "clean.arrow", batches(progress))
        keep = kept_mask(arrays.pop("empty"), arrays.pop("too_long"), arrays.pop("pair_keys"),
                         cfg)
    kept = int(keep.sum())
    if not kept:
        where = cfg.path or cfg.src_path or cfg.hub_name
        raise TmtError(f"{where}: no usable sentence pairs after cleaning (all empty, malformed "
                       f"or filtered); check the file and data.src_lang / data.tgt_lang")
    if cfg.max_pairs is not None and cfg.max_pairs < kept:
        # A seeded random sample rather than the first N: corpora such as Tatoeba are
        # sorted by length, so their head holds only the shortest sentences.
        # random.sample (not numpy) keeps the sample, and so the split, of runs made before;
        # it holds k Python ints (a pool of len(rows) only when k is near it), briefly.
        rows = np.flatnonzero(keep)
        sample = random.Random(cfg.seed).sample(range(kept), cfg.max_pairs)
        keep[:] = False
        keep[rows[np.array(sample, dtype=np.int64)]] = True
        del rows, sample
        log.info("data.max_pairs: a seeded sample of %d pairs kept", cfg.max_pairs)
    return CleanCorpus(pairs, sentence_graph(arrays["src_keys"], arrays["tgt_keys"], keep))


# --------------------------------------------------------------------------- splitting

def split_by_component(src: list[str], tgt: list[str], cfg: DataConfig) -> Splits:
    """Seeded split in which no source sentence and no target sentence is in two splits, of
    pairs held in lists (`split_corpus` is the same over a corpus of any size).

    Splitting by source sentence alone is not enough: Tatoeba often has several English
    sentences with one Italian translation, so the test split's references would occur among
    the training targets and reward memorisation."""
    splits = assign_splits(sentence_graph(sentence_keys(src), sentence_keys(tgt)),
                           cfg.valid_size, cfg.test_size, cfg.seed)

    def build(code: int) -> datasets.Dataset:
        rows = np.flatnonzero(splits == code)
        return datasets.Dataset.from_dict({"src": [src[i] for i in rows],
                                           "tgt": [tgt[i] for i in rows]})

    return Splits(train=build(0), valid=build(1), test=build(2))


def split_corpus(clean: CleanCorpus, cfg: DataConfig, directory: Path) -> Splits:
    """Split the kept pairs as `split_by_component` does and write each split to
    directory/{train,valid,test} in one streamed pass, in the layout of Dataset.save_to_disk
    (pairs in corpus order)."""
    with stage("splitting", len(clean.pairs)) as progress:
        split_of_row = assign_splits(clean.graph, cfg.valid_size, cfg.test_size, cfg.seed)
        writers = []
        for name in SPLIT_NAMES:
            (directory / name).mkdir(parents=True)
            writers.append(ArrowWriter(features=PAIR_FEATURES, path=str(directory / name /
                                                                          SPLIT_FILE)))
        start = 0
        for batch in record_batches(clean.pairs):
            here = split_of_row[start:start + batch.num_rows]
            for code, writer in enumerate(writers):
                chosen = here == code
                if chosen.any():
                    writer.write_table(pa.Table.from_batches([batch.filter(pa.array(chosen))]))
            start += batch.num_rows
            progress.update(batch.num_rows)
        rows = {}
        for name, writer in zip(SPLIT_NAMES, writers):
            rows[name], _ = writer.finalize()
            writer.close()
            _describe_split_folder(directory / name, name)
    return Splits(train=StreamedSplit([directory / "train" / SPLIT_FILE], rows["train"]),
                  valid=load_split(directory / "valid"), test=load_split(directory / "test"))


def _describe_split_folder(folder: Path, name: str) -> None:
    """The two files beside the Arrow data that make `folder` what Dataset.save_to_disk writes,
    so that datasets.load_from_disk opens it (and runs from before stay readable)."""
    datasets.DatasetInfo(features=PAIR_FEATURES).write_to_directory(str(folder))
    state = {"_data_files": [{"filename": SPLIT_FILE}], "_fingerprint": f"tmt-split-{name}",
             "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
             "_output_all_columns": False, "_split": None}
    (folder / "state.json").write_text(json.dumps(state, indent=2), encoding="utf-8")


def prepare_splits(cfg: DataConfig, directory: Path) -> Splits:
    """Read, clean, optionally subsample and split the corpus into directory/{train,valid,test};
    the intermediate Arrow files (in directory/.corpus) are removed once the splits are
    written."""
    work = directory / ".corpus"
    try:
        raw = load_corpus(cfg, work)
        return split_corpus(clean_corpus(raw, cfg, work), cfg, directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load_split(path: Path) -> datasets.Dataset:
    """A small split (valid, test) written by `split_corpus` or saved by an older tmt, memory-
    mapped for random access and checked whole: a damaged one ends in a TmtError naming it
    rather than in a crash later."""
    try:
        ds = datasets.load_from_disk(str(path))
        if not isinstance(ds, datasets.Dataset) or not {"src", "tgt"} <= set(ds.column_names):
            raise ValueError("not a split with 'src' and 'tgt' columns")
        ds.data.validate(full=True)
    # datasets and Arrow raise many types (JSON, Arrow, OS, key errors) for damaged files; all
    # mean the same to the user.
    except Exception as exc:
        raise _damaged_split(path, exc) from None
    return ds


def open_streamed_split(path: Path, check_contents: bool = True) -> StreamedSplit:
    """The train split (of any size) as a stream. Its files are named by the folder's
    state.json (what Dataset.save_to_disk writes, so runs of older tmt open too); each file's
    schema (at its head) and end-of-stream marker (at its tail: a cut file lacks it) are
    checked. With `check_contents` they are also read through and validated, which a training
    start skips: it reads the train split's token store, not its text."""
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        split = StreamedSplit([path / entry["filename"] for entry in state["_data_files"]])
        for file in split.files:
            with pa.OSFile(str(file)) as handle:
                schema = pa.ipc.open_stream(handle).schema
                if not {"src", "tgt"} <= set(schema.names):
                    raise ValueError("not a split with 'src' and 'tgt' columns")
                handle.seek(handle.size() - len(ARROW_END_OF_STREAM))
                if handle.read() != ARROW_END_OF_STREAM:
                    raise ValueError("the file is cut short (no end-of-stream marker)")
        if check_contents:
            split._num_rows = 0
            for batch in split.record_batches():
                batch.validate(full=True)
                split._num_rows += batch.num_rows
    except Exception as exc:        # as in load_split: every failure means the same
        raise _damaged_split(path, exc) from None
    return split


def _damaged_split(path: Path, exc: Exception) -> TmtError:
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return TmtError(f"the run's saved split {path} is damaged or missing ({detail}); "
                    f"restore the run directory from a backup or start a new run")


def load_splits(directory: Path, check_train: bool = True) -> Splits:
    return Splits(train=open_streamed_split(directory / "train", check_train),
                  valid=load_split(directory / "valid"), test=load_split(directory / "test"))

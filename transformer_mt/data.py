"""Load a parallel corpus through Hugging Face `datasets`, clean it, and split it without leakage.

Every source ends up as a `datasets.Dataset` with two string columns, `src` and `tgt`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from .config import DataConfig
from .errors import TmtError
from .textio import read_text_lines
from .tokenizer import normalize_text, token_limit_end

log = logging.getLogger(__name__)

HUB_HOST = "huggingface.co"
MALFORMED_LINES_SHOWN = 5


@dataclass
class Splits:
    train: datasets.Dataset
    valid: datasets.Dataset
    test: datasets.Dataset

    def items(self):
        return (("train", self.train), ("valid", self.valid), ("test", self.test))


# --------------------------------------------------------------------------- loading

def column(ds: datasets.Dataset, name: str) -> list:
    """A column as a Python list (through Arrow: much faster than iterating the Dataset)."""
    return ds.data.column(name).to_pylist()


def _local_file(path: str | None, what: str) -> str:
    if path and Path(path).is_dir():
        raise TmtError(f"{path} ({what}) is a directory; point the config at a corpus file")
    if not path or not Path(path).is_file():
        raise TmtError(f"corpus file not found: {path} ({what}); point the config at an existing "
                       f"file, e.g. --set data.path=../shared/data/tatoeba-en-it/en-it.tsv")
    return path


def _report_skipped(where: str, bad_rows: list[int], total: int, unit: str, what: str) -> None:
    if bad_rows:
        shown = ", ".join(map(str, bad_rows[:MALFORMED_LINES_SHOWN]))
        more = ", ..." if len(bad_rows) > MALFORMED_LINES_SHOWN else ""
        log.warning("%s: skipped %d of %d %s %s (%s %s%s)", where, len(bad_rows), total, unit,
                    what, unit, shown, more)


def _load_tsv(cfg: DataConfig) -> datasets.Dataset:
    # Read as plain lines and split on the tab ourselves: a CSV reader would interpret the
    # quote characters that the Tatoeba file contains.
    path = _local_file(cfg.path, "data.path")
    fields = [line.split("\t") for line in read_text_lines(path)]
    _report_skipped(path, [i + 1 for i, f in enumerate(fields) if len(f) != 2], len(fields),
                    "lines", "that are not 'source<TAB>target'")
    good = [f for f in fields if len(f) == 2]
    return datasets.Dataset.from_dict({"src": [f[0] for f in good], "tgt": [f[1] for f in good]})


def _as_mapping(row: Any) -> dict:
    """One row of a `translation` column as a dict ({} for null or junk). When rows have
    different keys, `datasets` keeps the column as JSON text."""
    if isinstance(row, str):
        try:
            row = json.loads(row)
        except ValueError:
            return {}
    return row if isinstance(row, dict) else {}


def _from_translation_column(ds: datasets.Dataset, cfg: DataConfig, where: str) -> datasets.Dataset:
    """Accept the opus_books schema {"translation": {src: ..., tgt: ...}} or flat src/tgt columns.
    Rows without a text in both languages are skipped and reported, as malformed TSV lines are."""
    columns = ds.column_names
    if "translation" in columns:
        rows = [_as_mapping(row) for row in column(ds, "translation")]
        src = [row.get(cfg.src_lang) for row in rows]
        tgt = [row.get(cfg.tgt_lang) for row in rows]
        languages = sorted({lang for row in rows for lang, text in row.items()
                            if text is not None})
    elif cfg.src_lang in columns and cfg.tgt_lang in columns:
        src, tgt = column(ds, cfg.src_lang), column(ds, cfg.tgt_lang)
        languages = columns
    else:
        raise TmtError(f"{where}: expected a 'translation' column or columns '{cfg.src_lang}' and "
                       f"'{cfg.tgt_lang}', found: {', '.join(columns)}")
    if not src:
        raise TmtError(f"{where} is empty: it holds no sentence pairs")
    good = [isinstance(s, str) and isinstance(t, str) for s, t in zip(src, tgt)]
    if not any(good):
        absent = [lang for lang in (cfg.src_lang, cfg.tgt_lang) if lang not in languages]
        detail = (f"no language '{absent[0]}' in any row" if absent else
                  f"no row has a text in both '{cfg.src_lang}' and '{cfg.tgt_lang}'")
        raise TmtError(f"{where}: {detail} (the rows have: {', '.join(languages) or 'none'}); "
                       f"set data.src_lang / data.tgt_lang")
    _report_skipped(where, [i + 1 for i, ok in enumerate(good) if not ok], len(good), "rows",
                    f"with no text in '{cfg.src_lang}' or '{cfg.tgt_lang}'")
    return datasets.Dataset.from_dict({"src": [s for s, ok in zip(src, good) if ok],
                                       "tgt": [t for t, ok in zip(tgt, good) if ok]})


def _load_structured(cfg: DataConfig, builder: str) -> datasets.Dataset:
    path = _local_file(cfg.path, "data.path")
    if os.path.getsize(path) == 0:
        raise TmtError(f"{path} is empty: it holds no sentence pairs")
    try:
        ds = datasets.load_dataset(builder, data_files=path, split="train")
    except Exception as exc:  # datasets wraps parser errors in several exception types
        cause = exc.__cause__ or exc
        raise TmtError(f"{path}: cannot read as {builder} ({type(cause).__name__}: "
                       f"{str(cause).splitlines()[0] if str(cause) else 'no detail'})") from None
    return _from_translation_column(ds, cfg, path)


def _load_text_pair(cfg: DataConfig) -> datasets.Dataset:
    src = read_text_lines(_local_file(cfg.src_path, "data.src_path"))
    tgt = read_text_lines(_local_file(cfg.tgt_path, "data.tgt_path"))
    if len(src) != len(tgt):
        raise TmtError(f"{cfg.src_path} has {len(src)} lines but {cfg.tgt_path} has {len(tgt)}; "
                       f"the two files must be line-aligned")
    return datasets.Dataset.from_dict({"src": src, "tgt": tgt})


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


def _load_hub(cfg: DataConfig) -> datasets.Dataset:
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
    return _from_translation_column(ds, cfg, cfg.hub_name)


def load_corpus(cfg: DataConfig) -> datasets.Dataset:
    """The raw corpus as a Dataset with columns `src` and `tgt` (not yet cleaned)."""
    datasets.disable_progress_bars()
    if cfg.source == "hub":
        return _load_hub(cfg)
    if cfg.source == "tsv":
        return _load_tsv(cfg)
    if cfg.source == "text":
        return _load_text_pair(cfg)
    return _load_structured(cfg, {"jsonl": "json", "parquet": "parquet"}[cfg.source])


# --------------------------------------------------------------------------- cleaning

def clean_pairs(src: list[str], tgt: list[str], cfg: DataConfig) -> tuple[list[str], list[str]]:
    """Normalise, drop empty pairs, dedupe exact pairs, then filter or truncate pairs with more
    than `cfg.max_len` tokens on a side. Tokens are counted as the word-level tokenizer splits
    text (a run of 30,000 punctuation marks is 30,000 tokens, not one word), so no pair kept
    here encodes to more than max_len word-level tokens."""
    seen = set()
    out_src, out_tgt = [], []
    empty = duplicates = too_long = 0
    for s, t in zip(src, tgt):
        s, t = normalize_text(s or ""), normalize_text(t or "")
        if not s or not t:
            empty += 1
            continue
        if (s, t) in seen:
            duplicates += 1
            continue
        seen.add((s, t))
        s_end, t_end = token_limit_end(s, cfg.max_len), token_limit_end(t, cfg.max_len)
        if s_end is not None or t_end is not None:
            too_long += 1
            if cfg.long_sentences == "filter":
                continue
            s, t = s[:s_end].rstrip(), t[:t_end].rstrip()
        out_src.append(s)
        out_tgt.append(t)
    action = "dropped" if cfg.long_sentences == "filter" else "truncated"
    log.info("corpus: %d pairs read, %d empty dropped, %d duplicates dropped, %d longer than %d "
             "tokens %s, %d kept", len(src), empty, duplicates, too_long, cfg.max_len, action,
             len(out_src))
    return out_src, out_tgt


# --------------------------------------------------------------------------- splitting

SPLIT_NAMES = ("train", "valid", "test")        # split codes 0, 1, 2 of `assign_splits`


def sentence_keys(sentences: list[str]) -> np.ndarray:
    """A stable 64-bit key per sentence (BLAKE2b, not Python's per-process salted `hash`), so
    that a split is the same in every process. Two different sentences share a key with
    probability ~n²/2⁶⁵ (1e-8 for Tatoeba); a collision only joins two components."""
    digests = b"".join(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest()
                       for s in sentences)
    return np.frombuffer(digests, dtype="<u8").copy()


def connected_components(src_keys: np.ndarray, tgt_keys: np.ndarray) -> np.ndarray:
    """Component id (0..C-1) per pair: two pairs are connected when they share a source key or a
    target key, directly or through other pairs.

    Union-find on arrays: sentences are nodes (sources and targets numbered apart, so the same
    string in both languages is two nodes), pairs are edges. Each round hooks the larger root
    of every edge under the smaller one, then compresses paths fully; parent[x] <= x always
    holds, so no cycle can form. A few dozen rounds suffice even for long chains."""
    src_node = np.unique(src_keys, return_inverse=True)[1].reshape(-1)
    tgt_node = np.unique(tgt_keys, return_inverse=True)[1].reshape(-1)
    tgt_node = tgt_node + (src_node.max() + 1 if len(src_node) else 0)
    parent = np.arange(int(tgt_node.max()) + 1 if len(tgt_node) else 0)
    while True:
        root_a, root_b = parent[src_node], parent[tgt_node]
        apart = root_a != root_b
        if not apart.any():
            break
        low = np.minimum(root_a[apart], root_b[apart])
        high = np.maximum(root_a[apart], root_b[apart])
        np.minimum.at(parent, high, low)
        while True:
            grandparent = parent[parent]
            if np.array_equal(grandparent, parent):
                break
            parent = grandparent
    return np.unique(parent[src_node], return_inverse=True)[1].reshape(-1)


def assign_splits(src_keys: np.ndarray, tgt_keys: np.ndarray, valid_size: int, test_size: int,
                  seed: int) -> np.ndarray:
    """Split code per pair (0 train, 1 valid, 2 test) such that no source and no target
    sentence is in two splits.

    Whole connected components (`connected_components`) are dealt out in a seeded random order:
    to valid until it holds at least `valid_size` distinct source sentences, then to test until
    it holds `test_size`, the rest to train. Sizes count distinct source sentences (the
    sentences `tmt evaluate` translates); a split overshoots by less than one component."""
    component = connected_components(src_keys, tgt_keys)
    count = int(component.max()) + 1 if len(component) else 0
    # Distinct source sentences per component: each source key lies in exactly one component.
    _, first = np.unique(src_keys, return_index=True)
    sources_per_component = np.bincount(component[first], minlength=count)
    total = int(sources_per_component.sum())
    if total <= valid_size + test_size:
        raise TmtError(f"the corpus has {total} distinct source sentences after cleaning, "
                       f"not enough for data.valid_size={valid_size} + data.test_size="
                       f"{test_size} and a training set; lower them or use more data")
    order = np.random.default_rng(seed).permutation(count)
    filled = np.cumsum(sources_per_component[order])
    # Components before the one that reaches the size, and that one too.
    valid_end = int(np.searchsorted(filled, valid_size)) + 1
    test_end = valid_end + (int(np.searchsorted(filled[valid_end:] - filled[valid_end - 1],
                                                test_size)) + 1 if test_size else 0)
    if test_end >= count:
        raise TmtError(f"data.valid_size={valid_size} and data.test_size={test_size} take all "
                       f"{count} groups of connected sentence pairs (pairs that share a source "
                       f"or target sentence); lower them or use more data")
    split_of_component = np.zeros(count, dtype=np.int8)
    split_of_component[order[:valid_end]] = 1
    split_of_component[order[valid_end:test_end]] = 2
    splits = split_of_component[component]
    sizes = np.bincount(component, minlength=count)
    log.info("split: %d groups of pairs connected by a shared source or target sentence, the "
             "largest of %d pairs; %s", count, int(sizes.max()),
             ", ".join(f"{name} {int((splits == code).sum())} pairs in "
                       f"{int((split_of_component == code).sum())} groups"
                       for code, name in enumerate(SPLIT_NAMES)))
    return splits


def split_by_component(src: list[str], tgt: list[str], cfg: DataConfig) -> Splits:
    """Seeded split in which no source sentence and no target sentence is in two splits.

    Splitting by source sentence alone is not enough: Tatoeba often has several English
    sentences with one Italian translation, so the test split's references would occur among
    the training targets and reward memorisation."""
    splits = assign_splits(sentence_keys(src), sentence_keys(tgt), cfg.valid_size,
                           cfg.test_size, cfg.seed)

    def build(code: int) -> datasets.Dataset:
        rows = np.flatnonzero(splits == code)
        return datasets.Dataset.from_dict({"src": [src[i] for i in rows],
                                           "tgt": [tgt[i] for i in rows]})

    return Splits(train=build(0), valid=build(1), test=build(2))


def prepare_splits(cfg: DataConfig) -> Splits:
    """Load, clean, optionally subsample, and split the corpus."""
    raw = load_corpus(cfg)
    src, tgt = clean_pairs(column(raw, "src"), column(raw, "tgt"), cfg)
    if not src:
        where = cfg.path or cfg.src_path or cfg.hub_name
        raise TmtError(f"{where}: no usable sentence pairs after cleaning (all empty, malformed "
                       f"or filtered); check the file and data.src_lang / data.tgt_lang")
    if cfg.max_pairs is not None and cfg.max_pairs < len(src):
        # A seeded random sample rather than the first N: corpora such as Tatoeba are
        # sorted by length, so their head holds only the shortest sentences.
        keep = sorted(random.Random(cfg.seed).sample(range(len(src)), cfg.max_pairs))
        src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
    return split_by_component(src, tgt, cfg)


def save_splits(splits: Splits, directory: Path) -> None:
    for name, ds in splits.items():
        ds.save_to_disk(str(directory / name))


def load_split(path: Path) -> datasets.Dataset:
    """One split saved by `save_splits`, checked whole: a damaged one ends in a TmtError naming it
    rather than in a crash later, halfway through an epoch."""
    try:
        ds = datasets.load_from_disk(str(path))
        if not isinstance(ds, datasets.Dataset) or not {"src", "tgt"} <= set(ds.column_names):
            raise ValueError("not a split with 'src' and 'tgt' columns")
        ds.data.validate(full=True)
    # datasets and Arrow raise many types (JSON, Arrow, OS, key errors) for damaged files; all
    # mean the same to the user.
    except Exception as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TmtError(f"the run's saved split {path} is damaged or missing ({detail}); "
                       f"restore the run directory from a backup or start a new run") from None
    return ds


def load_splits(directory: Path) -> Splits:
    return Splits(**{name: load_split(directory / name) for name in ("train", "valid", "test")})

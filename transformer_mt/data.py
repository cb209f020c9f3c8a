"""Load a parallel corpus through Hugging Face `datasets`, clean it, and split it without leakage.

Every source ends up as a `datasets.Dataset` with two string columns, `src` and `tgt`.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import socket
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import datasets

from .config import DataConfig
from .errors import TmtError
from .tokenizer import token_limit_end

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


def utf8_lines(handle: BinaryIO, name: str) -> Iterator[str]:
    """The lines of a byte stream as text, without their line endings (LF or CRLF; a final newline
    adds no line) and without a UTF-8 byte-order mark. Only LF ends a line, so that line numbers
    match what editors and `wc -l` show (str.splitlines would also split at U+2028 and friends).
    Bytes that are not UTF-8 stop the reading with the line's number."""
    for number, raw in enumerate(handle, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            hint = " (it looks like UTF-16)" if raw.startswith((b"\xff\xfe", b"\xfe\xff")) else ""
            raise TmtError(f"{name}: line {number} is not UTF-8 text{hint}: {exc.reason} at byte "
                           f"{exc.start + 1} of the line; convert it to UTF-8 (e.g. iconv -f "
                           f"latin1 -t utf-8)") from None
        if number == 1:
            line = line.removeprefix("\ufeff")
        yield line.removesuffix("\n").removesuffix("\r")


def read_text_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file (see `utf8_lines`); an empty file is an error."""
    try:
        with open(path, "rb") as handle:
            lines = list(utf8_lines(handle, str(path)))
    except OSError as exc:
        raise TmtError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not lines:
        raise TmtError(f"{path} is empty: it holds no sentences")
    return lines


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

# Control characters (Unicode Cc), invisible format characters (Cf: zero-width spaces and joiners,
# direction marks, BOM, soft hyphen) and line/paragraph separators: all become spaces.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028-\u202e"
                        "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb]")


def normalize_text(text: str) -> str:
    """NFC, control and format characters to spaces, runs of white space to one space."""
    text = _INVISIBLE.sub(" ", unicodedata.normalize("NFC", text))
    return " ".join(text.split())


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

def split_by_source(src: list[str], tgt: list[str], cfg: DataConfig) -> Splits:
    """Seeded split in which all pairs that share a source sentence go to the same split.

    Tatoeba has many English sentences with several Italian translations; splitting pairs
    independently would put the same English sentence in train and test.
    """
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(src):
        groups.setdefault(s, []).append(i)
    sources = sorted(groups)
    rng = random.Random(cfg.seed)
    rng.shuffle(sources)
    held_out = cfg.valid_size + cfg.test_size
    if len(sources) <= held_out:
        raise TmtError(f"the corpus has {len(sources)} distinct source sentences after cleaning, "
                       f"not enough for data.valid_size={cfg.valid_size} + data.test_size="
                       f"{cfg.test_size} and a training set; lower them or use more data")
    parts = {"valid": sources[:cfg.valid_size],
             "test": sources[cfg.valid_size:held_out],
             "train": sources[held_out:]}

    def build(names: list[str]) -> datasets.Dataset:
        rows = sorted(i for name in names for i in groups[name])
        return datasets.Dataset.from_dict({"src": [src[i] for i in rows],
                                           "tgt": [tgt[i] for i in rows]})

    return Splits(train=build(parts["train"]), valid=build(parts["valid"]),
                  test=build(parts["test"]))


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
    return split_by_source(src, tgt, cfg)


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

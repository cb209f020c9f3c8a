"""The data a run owns: its frozen split, its tokenizers and the encoded ids (the directory's
layout, ownership and lock are in rundir.py).

Saving the split makes a resumed run independent of the corpus source: it continues on exactly
the data it started with, even if the hub is unreachable or the file changed. A resume never
splits or tokenizes the corpus again.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import datasets

from .batching import EncodedPairs, encode_split
from .checkpoint import Checkpoint
from .config import Config
from .data import Splits, column, load_split, load_splits, prepare_splits, save_splits
from .errors import TmtError

# RunDir and the run lookups lived here before rundir.py; they are still imported from here.
from .rundir import (  # noqa: F401
    CHECKPOINT_NAMES,
    RunDir,
    commit_staging,
    find_checkpoint,
    fingerprint,
    fresh_staging,
    latest_run,
    run_of_checkpoint,
)
from .tokenizer import TextCodec, train_tokenizer

log = logging.getLogger(__name__)


@dataclass
class RunData:
    splits: Splits
    src_codec: TextCodec
    tgt_codec: TextCodec
    train: EncodedPairs
    valid: EncodedPairs


def prepare_data(cfg: Config, run: RunDir) -> None:
    """Create the run's split and tokenizers unless it has them (its run.json says so).

    Everything is written to a staging folder first and moved into place, run.json last, so a run
    killed half-way through leaves only tmt-named partial state, which the next start removes
    (or completes, once run.json is staged)."""
    if run.marker.is_file():
        return
    identity = fingerprint(cfg)       # the corpus as it is now, before it is read
    splits = prepare_splits(cfg.data)
    log.info("split: %d train, %d valid, %d test pairs (no sentence in two splits)",
             len(splits.train), len(splits.valid), len(splits.test))
    staging = fresh_staging(run)
    try:
        save_splits(splits, staging / "data")
        _train_tokenizers(cfg, splits, staging / "tokenizers")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    commit_staging(run, identity)


def _train_tokenizers(cfg: Config, splits: Splits, directory: Path) -> None:
    directory.mkdir(parents=True)
    # Trained on the train split only: valid/test words must not leak into the vocabulary.
    if cfg.tokenizer.joint:
        # One vocabulary learnt from both languages, saved under both names so that everything
        # downstream reads a run the same way whatever the tokenizer type.
        both_sides = column(splits.train, "src") + column(splits.train, "tgt")
        codec = TextCodec(train_tokenizer(both_sides, cfg.tokenizer))
        for side in ("src", "tgt"):
            codec.save(directory / f"{side}.json")
        log.info("joint %s tokenizer: %d subwords (trained on both sides)", cfg.tokenizer.type,
                 codec.vocab_size)
    else:
        for side in ("src", "tgt"):
            codec = TextCodec(train_tokenizer(splits.train[side], cfg.tokenizer))
            codec.save(directory / f"{side}.json")
            log.info("%s tokenizer: %d words (min_frequency %d)", side, codec.vocab_size,
                     cfg.tokenizer.min_frequency)


def restore_tokenizers(run: RunDir, checkpoint: Checkpoint) -> None:
    """Make sure the run's tokenizer files are the ones the checkpoint was trained with: a
    missing file is restored from the copy embedded in the checkpoint; a damaged or different
    one is refused (it is left as it is)."""
    embedded, vocab = checkpoint.tokenizers, checkpoint.vocab
    for side in ("src", "tgt"):
        path = run.tokenizers / f"{side}.json"
        if not path.is_file():
            if side not in embedded:
                raise TmtError(f"{path} is missing and {run.last} holds no copy of it; restore "
                               f"the file from a backup or start a new run with --run-dir")
            run.tokenizers.mkdir(exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(embedded[side], encoding="utf-8")
            os.replace(tmp, path)
            log.warning("restored %s from the copy in %s", path, run.last)
            continue
        try:
            codec = TextCodec.load(path)
        except (TmtError, ValueError) as exc:      # ValueError: not UTF-8
            reason = str(exc).removeprefix(f"{path}: ")
            raise TmtError(f"{path} is damaged ({reason}); delete it and resume again to "
                           f"restore it from {run.last}") from None
        mismatch = ("the checkpoint and the run's tokenizers come from different runs; resume "
                    "each checkpoint in its own run directory")
        if side in vocab and vocab[side] != codec.vocab_size:
            raise TmtError(f"{run.last} was trained with a {side} vocabulary of {vocab[side]} "
                           f"entries, but {path} has {codec.vocab_size}: {mismatch}")
        if side in embedded and codec.to_str() != embedded[side]:
            raise TmtError(f"{path} is not the tokenizer {run.last} was trained with (same size, "
                           f"other entries): {mismatch}")


def load_data(run: RunDir) -> RunData:
    """The run's split, tokenizers and encoded ids (tokenized once, then read from the cache)."""
    splits = load_splits(run.data)
    src_codec = TextCodec.load(run.tokenizers / "src.json")
    tgt_codec = TextCodec.load(run.tokenizers / "tgt.json")
    encoded = {name: EncodedPairs(encode_split(ds, src_codec, tgt_codec))
               for name, ds in (("train", splits.train), ("valid", splits.valid))}
    return RunData(splits, src_codec, tgt_codec, encoded["train"], encoded["valid"])


def load_test_split(run: RunDir) -> datasets.Dataset:
    path = run.data / "test"
    if not (path / "dataset_info.json").is_file():
        raise TmtError(f"{run.path} has no saved test split ({path}); is it a tmt run directory?")
    return load_split(path)

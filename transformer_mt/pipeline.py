"""The data a run owns, from the corpus to token ids on disk (corpus.py reads, cleans and splits
the corpus; the run directory's layout, ownership and lock are in rundir.py):

    corpus -> corpus.prepare_splits -> data/{train,valid,test}    (frozen split, Arrow)
           -> tokenizers/{src,tgt}.json                           (trained on the train split)
           -> data/ids/{train,valid}                              (token ids, flat arrays;
                                                                   train's with the extra pairs
                                                                   of data.copy_augment)

Each stage streams its input in batches, so preparation needs memory for a batch and a few
arrays of per-pair keys, not for the corpus. Saving the split makes a resumed run independent of
the corpus source: it continues on exactly the data it started with, even if the hub is
unreachable or the file changed. A resume never reads the corpus, splits or tokenizes again: it
maps the token stores.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np

from .arrow_io import record_batches, sentence_batches, texts
from .checkpoint import Checkpoint
from .config import Config, DataConfig
from .corpus import Splits, load_split, load_splits, prepare_splits
from .errors import TmtError
from .names import copy_augmented
from .progress import stage

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
from .token_store import TokenStore, write_token_store
from .tokenizer import TextCodec, train_tokenizer

log = logging.getLogger(__name__)

ENCODED_SPLITS = ("train", "valid")       # test is translated from its text by tmt evaluate


@dataclass
class RunData:
    splits: Splits                # the texts: valid's are translated at validation
    src_codec: TextCodec
    tgt_codec: TextCodec
    train: TokenStore             # the ids training and validation loss read
    valid: TokenStore


def prepare_data(cfg: Config, run: RunDir,
                 codecs: tuple[TextCodec, TextCodec] | None = None) -> None:
    """Create the run's split, tokenizers and token ids unless it has them (its run.json says
    so); with `codecs` (fine-tuning), those tokenizers are the run's instead of new ones.

    Everything is written to a staging folder first and moved into place, run.json last, so a run
    killed half-way through leaves only tmt-named partial state, which the next start removes
    (or completes, once run.json is staged)."""
    if run.marker.is_file():
        return
    identity = fingerprint(cfg)       # the corpus as it is now, before it is read
    staging = fresh_staging(run)
    try:
        splits = prepare_splits(cfg.data, staging / run.data.name)
        log.info("split: %d train, %d valid, %d test pairs (no sentence in two splits)",
                 len(splits.train), len(splits.valid), len(splits.test))
        if codecs is None:
            codecs = _train_tokenizers(cfg, splits.train, staging / run.tokenizers.name)
        else:
            _save_tokenizers(codecs, staging / run.tokenizers.name)
        for name in ENCODED_SPLITS:
            encode_split(getattr(splits, name), *codecs,
                         staging / run.ids.relative_to(run.path) / name,
                         cfg.data if name == "train" else None)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    commit_staging(run, identity)


def _train_tokenizers(cfg: Config, train: datasets.Dataset,
                      directory: Path) -> tuple[TextCodec, TextCodec]:
    directory.mkdir(parents=True)
    rows = None
    if cfg.tokenizer.sample_pairs is not None and cfg.tokenizer.sample_pairs < len(train):
        rows = np.sort(np.random.default_rng(cfg.data.seed).choice(
            len(train), cfg.tokenizer.sample_pairs, replace=False))
    pairs = len(train) if rows is None else len(rows)
    # Trained on the train split only: valid/test words must not leak into the vocabulary.
    if cfg.tokenizer.joint:
        # One vocabulary learnt from both languages, saved under both names so that everything
        # downstream reads a run the same way whatever the tokenizer type.
        with stage("tokenizer training", 2 * pairs, unit="sentences") as progress:
            both_sides = (batch for side in ("src", "tgt")
                          for batch in sentence_batches(train, side, rows, progress))
            codec = TextCodec(train_tokenizer(both_sides, cfg.tokenizer))
        for side in ("src", "tgt"):
            codec.save(directory / f"{side}.json")
        log.info("joint %s tokenizer: %d subwords (trained on both sides of %d pairs)",
                 cfg.tokenizer.type, codec.vocab_size, pairs)
        return codec, codec
    codecs = []
    with stage("tokenizer training", 2 * pairs, unit="sentences") as progress:
        for side in ("src", "tgt"):
            codec = TextCodec(train_tokenizer(sentence_batches(train, side, rows, progress),
                                              cfg.tokenizer))
            codec.save(directory / f"{side}.json")
            log.info("%s tokenizer: %d words (min_frequency %d, %d pairs)", side,
                     codec.vocab_size, cfg.tokenizer.min_frequency, pairs)
            codecs.append(codec)
    return codecs[0], codecs[1]


def _save_tokenizers(codecs: tuple[TextCodec, TextCodec], directory: Path) -> None:
    directory.mkdir(parents=True)
    for side, codec in zip(("src", "tgt"), codecs):
        codec.save(directory / f"{side}.json")
    log.info("tokenizers of train.init_from: %d/%d entries", codecs[0].vocab_size,
             codecs[1].vocab_size)


def encode_split(split: datasets.Dataset, src_codec: TextCodec, tgt_codec: TextCodec,
                 path: Path, augment: DataConfig | None = None) -> TokenStore:
    """Tokenize a split batch by batch into a new token store at `path`; with `augment` (the
    train split's data config), the copy-augmented pairs it asks for are added after each
    batch's own (the saved split stays as it was: the unseen-words checks read it)."""
    added = 0

    def batches(progress):
        nonlocal added
        first = 0
        for batch in record_batches(split):
            srcs, tgts = texts(batch, "src"), texts(batch, "tgt")
            if augment is not None and augment.copy_augment > 0:
                extra_srcs, extra_tgts = copy_augmented(srcs, tgts, augment.copy_augment,
                                                        augment.seed, first)
                srcs, tgts, added = srcs + extra_srcs, tgts + extra_tgts, added + len(extra_srcs)
            yield src_codec.encode_batch(srcs), tgt_codec.encode_batch(tgts)
            first += batch.num_rows
            progress.update(batch.num_rows)

    with stage(f"encoding {path.name}", len(split)) as progress:
        store = write_token_store(path, batches(progress), src_codec.vocab_size,
                                  tgt_codec.vocab_size)
    if added:
        log.info("copy augmentation: %d extra %s pairs with invented names (data.copy_augment "
                 "%g)", added, path.name, augment.copy_augment)
    return store


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


def load_data(run: RunDir, data_cfg: DataConfig | None = None) -> RunData:
    """The run's split, tokenizers and token stores. A store is written at preparation; one that
    is missing (a run prepared by an older tmt, or deleted) is encoded once from the saved
    split, never from the corpus, with the copy augmentation `data_cfg` asks for (none
    without it)."""
    splits = load_splits(run.data, check_train=False)
    src_codec = TextCodec.load(run.tokenizers / "src.json")
    tgt_codec = TextCodec.load(run.tokenizers / "tgt.json")
    stores = {name: _token_store(run.ids / name, getattr(splits, name), src_codec, tgt_codec,
                                 data_cfg if name == "train" else None)
              for name in ENCODED_SPLITS}
    return RunData(splits, src_codec, tgt_codec, stores["train"], stores["valid"])


def _token_store(path: Path, split: datasets.Dataset, src_codec: TextCodec,
                 tgt_codec: TextCodec, augment: DataConfig | None) -> TokenStore:
    """The split's token store; encoded from the split when missing, and again when damaged (it
    is derived data that tmt wrote, in a folder of its own)."""
    if path.is_dir() and not path.is_symlink():
        try:
            return TokenStore(path)
        except TmtError as exc:
            log.warning("%s; encoding the saved split again", exc)
            shutil.rmtree(path)
    elif not path.exists():
        log.warning("no token store %s (a run prepared by an older tmt?); encoding the saved "
                    "split once", path)
    return encode_split(split, src_codec, tgt_codec, path, augment)


def load_held_out_split(run: RunDir, name: str = "test") -> datasets.Dataset:
    """The run's saved "valid" or "test" split."""
    path = run.data / name
    if not (path / "dataset_info.json").is_file():
        raise TmtError(f"{run.path} has no saved {name} split ({path}); is it a tmt run "
                       f"directory?")
    return load_split(path)

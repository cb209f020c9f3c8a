"""A run directory and the data it owns: the frozen split, the tokenizers and the encoded ids.

    runs/<name>/
      config.yaml            resolved config of the latest start or resume
      data/{train,valid,test}/   the cleaned, split corpus (datasets on disk, with encoded ids cached)
      tokenizers/{src,tgt}.json  (the same file twice for a joint BPE vocabulary)
      checkpoints/last.pt, best.pt, stepNNNNNNNN.pt, average_*.pt (tmt average)
      tensorboard/           event files (tensorboard --logdir runs)
      eval/                  hypotheses and JSON reports of tmt evaluate
      train.log

Saving the split makes a resumed run independent of the corpus source: it continues on exactly
the data it started with, even if the hub is unreachable or the file changed.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import datasets

from .batching import EncodedPairs, encode_split
from .checkpoint import BEST, LAST
from .config import Config
from .data import Splits, column, load_split, load_splits, prepare_splits, save_splits
from .errors import TmtError
from .tokenizer import TextCodec, train_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def data(self) -> Path:
        return self.path / "data"

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

    def ensure_writable(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise TmtError(f"run directory {self.path} is not writable ({exc.strerror}); choose "
                           f"another with --run-dir") from None


@dataclass
class RunData:
    splits: Splits
    src_codec: TextCodec
    tgt_codec: TextCodec
    train: EncodedPairs
    valid: EncodedPairs


def prepare_data(cfg: Config, run: RunDir) -> None:
    """Create the run's split and tokenizers if it has none yet (idempotent).

    Everything is written to a staging folder first and moved into place with renames, data
    last, so a run killed half-way through leaves either nothing or a complete set."""
    if run.data.is_dir() and (run.tokenizers / "tgt.json").is_file():
        return
    splits = prepare_splits(cfg.data)
    log.info("split: %d train, %d valid, %d test pairs (no source sentence in two splits)",
             len(splits.train), len(splits.valid), len(splits.test))
    staging = run.path / ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    save_splits(splits, staging / "data")
    (staging / "tokenizers").mkdir(parents=True)
    # Trained on the train split only: valid/test words must not leak into the vocabulary.
    if cfg.tokenizer.joint:
        # One vocabulary learnt from both languages, saved under both names so that everything
        # downstream reads a run the same way whatever the tokenizer type.
        both_sides = column(splits.train, "src") + column(splits.train, "tgt")
        codec = TextCodec(train_tokenizer(both_sides, cfg.tokenizer))
        for side in ("src", "tgt"):
            codec.save(staging / "tokenizers" / f"{side}.json")
        log.info("joint BPE tokenizer: %d subwords (trained on both sides)", codec.vocab_size)
    else:
        for side in ("src", "tgt"):
            codec = TextCodec(train_tokenizer(splits.train[side], cfg.tokenizer))
            codec.save(staging / "tokenizers" / f"{side}.json")
            log.info("%s tokenizer: %d words (min_frequency %d)", side, codec.vocab_size,
                     cfg.tokenizer.min_frequency)
    for name in ("tokenizers", "data"):
        shutil.rmtree(run.path / name, ignore_errors=True)
        os.replace(staging / name, run.path / name)
    staging.rmdir()


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

"""Training: `run_training` takes a run from its config to its last checkpoint; the `Trainer`
takes steps (train_step.py), decides (validate, checkpoint, stop) and checkpoints."""

from __future__ import annotations

import contextlib
import enum
import itertools
import logging
import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Subset
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from .allocator import allocator_report
from .batching import Batch, Collator, TokenBatchSampler, make_loader
from .checkpoint import (
    Checkpoint,
    TrainState,
    check_fits,
    check_writable,
    human_size,
    read_checkpoint,
    remove_partial_writes,
    rng_state,
    rotate,
    save,
    set_rng_state,
    step_checkpoint_name,
    training_checkpoint,
)
from .config import Config, save_config
from .device import pick_device
from .distributed import (
    DistInfo,
    any_rank,
    barrier,
    broadcast_from_main,
    gather_to_main,
    init_distributed,
    shutdown,
)
from .errors import TmtError
from .logs import log_to_file, setup_logging
from .model import Transformer, build_model, count_parameters
from .model.flops import peak_flops, training_flops
from .pipeline import RunData, load_data, prepare_data, restore_tokenizers
from .resume import check_resume_config, read_init_checkpoint, rising_rate_warning
from .rundir import RunDir, claim_for_training
from .stopping import StopRequest
from .token_store import TokenStore
from .train_step import StepResult, TrainStep, learning_rate
from .translator import Translator
from .validation import ValidationResult, Validator, log_validation

log = logging.getLogger(__name__)


class StopReason(enum.Enum):
    """Why training stopped."""
    FINISHED = "finished"      # train.max_steps or train.max_epochs reached
    FAULTS = "faults"          # train.max_bad_steps non-finite steps in a row
    PATIENCE = "patience"      # no better validation score in train.patience validations
    SIGNAL = "signal"          # SIGINT/SIGTERM: a checkpoint is saved, resume later


def trainable_pairs(pairs: TokenStore, max_len: int) -> tuple[Dataset, np.ndarray]:
    """The training pairs with at most `max_len` tokens on each side, and their batch lengths.

    The corpus was filtered by word-level tokens already; subword (BPE) encodings can be longer,
    and this is the last point where every length is known. The frozen split and tokenizers
    decide the result, so a resumed run keeps the same pairs and batch plan."""
    lengths = pairs.lengths()
    # lengths() counts the special tokens around each side: [SOS] src [EOS], tgt + one.
    fits = (lengths[:, 0] - 2 <= max_len) & (lengths[:, 1] - 1 <= max_len)
    if fits.all():
        return pairs, lengths
    kept = np.flatnonzero(fits)
    if not len(kept):
        raise TmtError(f"every training pair encodes to more than data.max_len={max_len} tokens "
                       f"on a side; raise data.max_len")
    log.info("%d of %d training pairs dropped: longer than data.max_len=%d subword tokens on a "
             "side", len(pairs) - len(kept), len(pairs), max_len)
    return Subset(pairs, kept), lengths[kept]


# --------------------------------------------------------------------------- the entry point

def run_training(cfg: Config, run: RunDir, resume: bool = False) -> int:
    """Train `run` with `cfg`: a new run, or with `resume` a continuation from its last.pt;
    alone or as one rank of torchrun. Returns the process exit code."""
    # Rank 0 alone writes the run (torchrun's other ranks only read it). It checks the directory
    # and takes the run's lock before joining the process group, so a second writer is stopped
    # before any rank waits for it.
    is_main = os.environ.get("RANK", "0") == "0"
    with claim_for_training(cfg, run, resume) if is_main else contextlib.nullcontext():
        info, device_name = init_distributed(cfg.train.device)
        try:
            return _train(cfg, run, resume, info, device_name)
        finally:
            shutdown()


def _train(cfg: Config, run: RunDir, resume: bool, info: DistInfo, device_name: str) -> int:
    checkpoint, changes = None, []
    if resume:
        checkpoint = read_checkpoint(run.last)
        if checkpoint.train is None:
            raise TmtError(f"{run.last} holds no training state (optimizer, counters, random "
                           f"states), so the run cannot resume from it; restore the last.pt that "
                           f"training wrote")
        changes = check_resume_config(cfg, checkpoint)
        max_steps = cfg.train.max_steps
        if max_steps is not None and checkpoint.step >= max_steps:
            if info.is_main:
                print(f"tmt: {run.path} already reached step {checkpoint.step} (train.max_steps="
                      f"{max_steps}); pass a larger --max-steps to continue", file=sys.stderr)
            return 0
    if info.is_main:
        setup_logging(hold_for_file=True)
    else:
        setup_logging(logging.WARNING, prefix=f"tmt[rank {info.rank}]")
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    device = pick_device(device_name)
    _seed_everything(cfg.train.seed)
    # Fine-tuning: a new run starts from another run's weights and tokenizers.
    init = read_init_checkpoint(cfg) if checkpoint is None and cfg.train.init_from else None
    data = _run_data(cfg, run, checkpoint, info, init)
    model = build_model(cfg.model, data.src_codec.vocab_size, data.tgt_codec.vocab_size,
                        cfg.tokenizer.joint)
    if checkpoint is not None:
        check_fits(checkpoint, model, run.last)
    if init is not None:
        if (data.src_codec.to_str(), data.tgt_codec.to_str()) != (init.tokenizers["src"],
                                                                 init.tokenizers["tgt"]):
            raise TmtError(f"{run.path} was prepared with other tokenizers than those of "
                           f"train.init_from; fine-tune in a new run directory")
        check_fits(init, model, Path(cfg.train.init_from),
                   advice="train.init_from needs a checkpoint of this model's shape")
        model.load_state_dict(init.model)
    model.to(device)
    if info.rank:
        torch.manual_seed(cfg.train.seed + info.rank)   # different dropout masks per rank
    trainer = Trainer(cfg, run, data, model, device, info)
    if checkpoint is not None:
        trainer.load_state_dict(checkpoint)      # refuses a checkpoint of another process count
    # Accepted: only now are the run's log and config written.
    if info.is_main:
        remove_partial_writes(run.checkpoints)
        log_to_file(run.path / "train.log")
        save_config(cfg, run.config)
        for change in changes:
            log.info(change)
        if checkpoint is not None and (warning := rising_rate_warning(cfg, checkpoint)):
            log.warning(warning)
    if checkpoint is not None:
        log.info("resumed %s at step %d (epoch %d)", run.path, trainer.state.step,
                 trainer.state.epoch)
    elif init is not None:
        log.info("fine-tuning: weights and tokenizers of %s (its step %s); new optimizer and "
                 "schedule", cfg.train.init_from, init.step)
    log.info(allocator_report())
    log.info("model: %s parameters, d_model %d, %d layers, vocab %d/%d; device %s%s; run %s",
             f"{count_parameters(model):,}", cfg.model.d_model, cfg.model.layers,
             data.src_codec.vocab_size, data.tgt_codec.vocab_size, device,
             f" x {info.world_size} processes" if info.enabled else "", run.path)
    return trainer.train()


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _run_data(cfg: Config, run: RunDir, checkpoint: Checkpoint | None, info: DistInfo,
              init: Checkpoint | None = None) -> RunData:
    """Rank 0 alone writes the split, the tokenizers and the encoded-ids cache; the other ranks
    wait, then read the very same files (no races, one split for all). A resume never
    prepares: the run's split and tokenizers are its identity."""
    if info.is_main:
        if checkpoint is not None:
            restore_tokenizers(run, checkpoint)
        else:
            prepare_data(cfg, run, init.codecs() if init is not None else None)
        data = load_data(run, cfg.data)
    barrier()
    if not info.is_main:
        data = load_data(run, cfg.data)
    return data


# --------------------------------------------------------------------------- the loop

@dataclass
class _Window:
    """What the steps since the last progress line add up to."""
    loss: float = 0.0        # summed over tokens, finite steps only
    tokens: float = 0.0
    seconds: float = 0.0     # in optimizer steps
    data_seconds: float = 0.0  # waiting for the next batches (DataLoader, collation)
    flops: float = 0.0       # this rank's model FLOPs (for MFU)


class Trainer:
    def __init__(self, cfg: Config, run: RunDir, data: RunData, model: Transformer,
                 device: torch.device, dist_info: DistInfo = DistInfo()):
        self.cfg, self.run, self.data, self.model, self.device = cfg, run, data, model, device
        self.dist = dist_info
        self.step_runner = TrainStep(cfg, model, device, data.tgt_codec.pad_id, dist_info)
        self.train_pairs, lengths = trainable_pairs(data.train, cfg.data.max_len)
        self.sampler = TokenBatchSampler(lengths, cfg.train.batch_tokens, cfg.train.seed,
                                         rank=dist_info.rank, world_size=dist_info.world_size)
        self.collator = Collator(data.src_codec, data.tgt_codec)
        self.translator = Translator(model, data.src_codec, data.tgt_codec, cfg.decode, device)
        self.validator = Validator(cfg, data, self.translator, self.step_runner.loss)
        self.state = TrainState(best_metric=cfg.train.best_metric)
        self.window = _Window()
        self.last_saved = 0           # the step of the newest checkpoint
        self.writer: SummaryWriter | None = None
        self.peak_flops: float | None = None      # per device, for MFU (rank 0 only)

    # ------------------------------------------------------------------ checkpoints

    def load_state_dict(self, checkpoint: Checkpoint) -> None:
        if checkpoint.world_size != self.dist.world_size:
            raise TmtError(f"cannot resume: the checkpoint was written by {checkpoint.world_size} "
                           f"process(es) and this run has {self.dist.world_size}; the batch plan "
                           f"and random states are per process, so resume with "
                           f"--nproc_per_node={checkpoint.world_size} (in all) for an exact "
                           f"continuation")
        self.model.load_state_dict(checkpoint.model)
        self.step_runner.optimizer.load_state_dict(checkpoint.optimizer)
        self.state = checkpoint.train
        # The validation loss is label-smoothed as training's: another smoothing, another scale.
        smoothing = checkpoint.settings("checkpoint").train.label_smoothing
        if self.state.rank_by(self.cfg.train.best_metric,
                              losses_comparable=smoothing == self.cfg.train.label_smoothing):
            log.info("resume: validations are ranked by %s from now on (a new metric, or losses "
                     "with another label smoothing); best.pt is replaced at the next validation",
                     self.cfg.train.best_metric)
        set_rng_state(checkpoint.rng_ranks[self.dist.rank])

    def save_checkpoint(self, best: bool = False) -> None:
        """Called on every rank (it gathers their random states); only rank 0 writes."""
        self.last_saved = self.state.step
        rng_ranks = gather_to_main(rng_state())
        checksums = gather_to_main(self._parameter_checksum())
        if not self.dist.is_main:
            return
        if len(set(checksums)) > 1:
            # DDP keeps replicas equal by construction; if they ever differ, stop rather than
            # checkpoint one replica of a diverged job (fairseq checks the same at each step).
            raise TmtError(f"parameters differ between ranks at step {self.state.step} "
                           f"(checksums {checksums}); the last good checkpoint is {self.run.last}")
        checkpoint = training_checkpoint(self.model, self.step_runner.optimizer, self.state,
                                         self.cfg, self.data.src_codec, self.data.tgt_codec,
                                         rng_ranks, checksums)
        # best.pt before last.pt: if we die in between, the resumed run (from the older last.pt)
        # validates again and rewrites best.pt, so the two never disagree.
        if best:
            save(checkpoint, self.run.best)
        size = save(checkpoint, self.run.last)
        snapshot = self.run.checkpoints / step_checkpoint_name(self.state.step)
        snapshot.unlink(missing_ok=True)
        snapshot.hardlink_to(self.run.last)      # a second name for the same bytes: no extra I/O
        # Older files go only now that the new one is safely on disk.
        rotate(self.run.checkpoints, self.cfg.train.keep_last, self.cfg.train.keep_best,
               self.state.scores())
        log.info("checkpoint at step %d: %s (%s)%s", self.state.step, self.run.last,
                 human_size(size), ", new best" if best else "")

    def _parameter_checksum(self) -> float:
        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.model.parameters()))

    def _validate_and_checkpoint(self) -> None:
        """Rank 0 validates; every rank receives its scores, so all make the same best/stop
        decisions and keep identical trainer state."""
        scores = None
        if self.dist.is_main:
            result = self.validator()
            self._log_validation(result)
            scores = result.loss, result.bleu
        loss, bleu = broadcast_from_main(scores)
        self.save_checkpoint(best=self.state.record_validation(loss, bleu))

    def _checkpoint_if_due(self) -> None:
        t, state = self.cfg.train, self.state
        if state.bad_steps:
            return          # never a checkpoint amid numerical faults
        if state.step % t.valid_every == 0:
            self._validate_and_checkpoint()
        elif state.step % t.checkpoint_every == 0:
            self.save_checkpoint()

    # ------------------------------------------------------------------ logging

    def _log_train(self, grad_norm: float) -> None:
        if self.writer is None:
            return
        window = self.window
        loss, tokens_per_s = window.loss / window.tokens, window.tokens / window.seconds
        # The share of the wall time spent waiting for batches: near 0 unless data loading is
        # the bottleneck (tokens/s counts the steps' time only).
        data_wait = window.data_seconds / max(window.data_seconds + window.seconds, 1e-9)
        lr = learning_rate(self.cfg.train, self.state.updates)
        log.info("step %d: loss %.3f, lr %.2e, grad norm %.2f, %.0f tokens/s, data wait %.1f%%",
                 self.state.step, loss, lr, grad_norm, tokens_per_s, 100 * data_wait)
        scalars = {"loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tokens_per_s,
                   "data_wait": data_wait}
        if self.peak_flops:
            scalars["mfu"] = window.flops / window.seconds / self.peak_flops
        for key, value in scalars.items():
            self.writer.add_scalar(f"train/{key}", value, self.state.step)

    def _log_validation(self, result: ValidationResult) -> None:
        log.info("validation at step %d: loss %.3f, ppl %.2f, BLEU %.2f, chrF %.2f",
                 self.state.step, result.loss, result.ppl, result.bleu, result.chrf)
        if self.writer:
            log_validation(self.writer, result, self.translator, self.state.step)

    def _model_flops(self, group: list[Batch]) -> float:
        """This rank's model FLOPs of one step (model/flops.py), for MFU on rank 0."""
        if self.peak_flops is None:
            return 0.0
        pad_src, pad_tgt = self.data.src_codec.pad_id, self.data.tgt_codec.pad_id
        return sum(training_flops(self.cfg.model, self.data.tgt_codec.vocab_size,
                                  (b.src != pad_src).sum(dim=1), (b.tgt_out != pad_tgt).sum(dim=1))
                   for b in group)

    # ------------------------------------------------------------------ steps and decisions

    def _step_groups(self) -> Iterator[list[Batch]]:
        """The rest of the current epoch, `accumulate` batches at a time."""
        self.sampler.set_epoch(self.state.epoch, self.state.batch_in_epoch)
        batches = iter(make_loader(self.train_pairs, self.sampler, self.collator,
                                   self.cfg.train.num_workers))
        while True:
            started = time.perf_counter()
            group = list(itertools.islice(batches, self.cfg.train.accumulate))
            self.window.data_seconds += time.perf_counter() - started
            if not group:
                return
            yield group

    def _take_step(self, group: list[Batch]) -> StepResult:
        state, window = self.state, self.window
        started = time.perf_counter()
        result = self.step_runner(group, state.updates)
        window.seconds += time.perf_counter() - started
        window.flops += self._model_flops(group)
        state.step += 1
        state.batch_in_epoch += len(group)
        if result.applied:
            state.bad_steps = 0
        else:
            state.bad_steps += 1
            state.skipped_steps += 1
            log.warning("step %d: non-finite %s, update skipped (%d in a row, %d in all)",
                        state.step, "loss" if not math.isfinite(result.loss) else "gradient",
                        state.bad_steps, state.skipped_steps)
        if math.isfinite(result.loss):
            window.loss += result.loss * result.tokens
            window.tokens += result.tokens
        return result

    def _patience_exhausted(self) -> bool:
        patience = self.cfg.train.patience
        if patience is None:
            return False
        if not self.state.best_step:
            return False        # nothing to be patient about yet (or a new metric: see rank_by)
        later = [step for step in self.state.scores() if step > self.state.best_step]
        return len(later) >= patience

    def _stop_reason(self, total: int) -> StopReason | None:
        """Why the run should stop after the current step, or None to go on."""
        if self.state.step >= total:
            return StopReason.FINISHED
        if self.state.bad_steps >= self.cfg.train.max_bad_steps:
            return StopReason.FAULTS
        if self._patience_exhausted():
            return StopReason.PATIENCE
        return None

    def total_steps(self) -> int:
        t = self.cfg.train
        by_epochs = t.max_epochs * math.ceil(len(self.sampler.batches(0)) / t.accumulate)
        return min(t.max_steps, by_epochs) if t.max_steps is not None else by_epochs

    def _train_epoch(self, total: int, bar: tqdm, stop: StopRequest) -> StopReason | None:
        """Steps through the rest of the epoch; why to stop, or None when the epoch is done."""
        t = self.cfg.train
        for group in self._step_groups():
            result = self._take_step(group)
            lr = learning_rate(t, self.state.updates)
            bar.update(1)
            bar.set_postfix(epoch=self.state.epoch, loss=f"{result.loss:.3f}", lr=f"{lr:.2e}",
                            tok_s=f"{self.window.tokens / max(self.window.seconds, 1e-9):.0f}",
                            refresh=False)
            if self.state.step % t.log_every == 0 and self.window.tokens:
                self._log_train(result.grad_norm)
                self.window = _Window()
            self._checkpoint_if_due()
            # Every rank must stop at the same step, whichever received the signal.
            signalled = any_rank(stop.signal is not None, self.device)
            reason = self._stop_reason(total) or (StopReason.SIGNAL if signalled else None)
            if reason:
                return reason
        self.state.epoch += 1
        self.state.batch_in_epoch = 0
        return None

    def train(self) -> int:
        """Train until max_steps/max_epochs, early stopping, repeated numerical faults or a stop
        signal. Returns the process exit code."""
        t = self.cfg.train
        total = self.total_steps()
        if self.state.step >= total:
            log.info("no step to train: the run is at step %d of %d (train.max_steps %s, "
                     "train.max_epochs %d); its data and tokenizers are ready in %s",
                     self.state.step, total, t.max_steps, t.max_epochs, self.run.path)
            return 0
        if self.dist.is_main:
            check_writable(self.run.checkpoints)
            # Events after the checkpoint are replayed by this run: drop the stale ones.
            self.writer = SummaryWriter(str(self.run.tensorboard), purge_step=self.state.step + 1)
            self.peak_flops, source = peak_flops(self.device)
            log.info("MFU in TensorBoard is against %.3g TFLOP/s per device (%s)",
                     self.peak_flops / 1e12, source)
        bar = tqdm(total=total, initial=self.state.step, desc="train", unit="step",
                   dynamic_ncols=True, mininterval=1.0, disable=not self.dist.is_main)
        self.window, self.last_saved = _Window(), self.state.step
        reason = None
        with StopRequest() as stop:
            while reason is None and self.state.epoch < t.max_epochs:
                reason = self._train_epoch(total, bar, stop)
            bar.close()
            reason = reason or StopReason.FINISHED
            # A finished run always ends validated, so it has a best.pt and a best score.
            if reason is StopReason.FINISHED and self.state.step not in self.state.validation_bleu:
                self._validate_and_checkpoint()
            elif reason is StopReason.SIGNAL and self.last_saved != self.state.step:
                self.save_checkpoint()
        if self.writer:
            self.writer.close()
        return self._report_end(reason, stop.signal)

    def _report_end(self, reason: StopReason, signum: int | None) -> int:
        state = self.state
        if reason is StopReason.SIGNAL:
            log.info("stopped at step %d; resume with: tmt train --run-dir %s --resume",
                     state.step, self.run.path)
            return 130 if signum in (signal.SIGINT, None) else 143
        if reason is StopReason.FAULTS:
            last_good = (f"the last good checkpoint is {self.run.last} (lower train.lr or check "
                         f"the data, then resume)" if self.run.last.is_file() else
                         "no checkpoint was written yet (lower train.lr or check the data, then "
                         "start again)")
            log.error("stopping: %d consecutive steps up to step %d had a non-finite loss or "
                      "gradient; %s", state.bad_steps, state.step, last_good)
            return 1
        if reason is StopReason.PATIENCE:
            log.info("early stopping at step %d: no better validation %s in %d validations",
                     state.step, state.best_metric, self.cfg.train.patience)
        log.info("finished at step %d (epoch %d); best validation: %s", state.step,
                 state.epoch, state.describe_best())
        return 0

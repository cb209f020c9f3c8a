"""The Trainer: label-smoothed loss, Adam with the Noam schedule, accumulation, clipping,
validation with BLEU/chrF, TensorBoard, checkpoints and exact resume."""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import signal
import time
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Subset
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from .attention_plot import attention_figure, cross_attention
from .batching import Batch, Collator, EncodedPairs, TokenBatchSampler, make_loader
from .checkpoint import (
    atomic_save,
    check_writable,
    human_size,
    rng_state,
    rotate,
    set_rng_state,
    step_checkpoint_name,
)
from .config import Config
from .device import autocast
from .distributed import DistInfo, any_rank, broadcast_from_main, gather_to_main, sum_across_ranks
from .errors import TmtError
from .evaluate import corpus_scores
from .loss import BatchLoss
from .model import Transformer
from .run import RunData, RunDir
from .stopping import StopRequest
from .translator import Translator

log = logging.getLogger(__name__)

SAMPLE_TRANSLATIONS = 5


def noam_factor(step: int, warmup: int) -> float:
    """Linear warm-up to the peak rate at `warmup`, then decay ∝ 1/√step (Vaswani et al.),
    scaled so that train.lr is the peak learning rate."""
    step = max(step, 1)
    return min(step / warmup, math.sqrt(warmup / step))


def trainable_pairs(pairs: EncodedPairs, max_len: int) -> tuple[Dataset, np.ndarray]:
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
    return Subset(pairs, kept.tolist()), lengths[kept]


class Trainer:
    def __init__(self, cfg: Config, run: RunDir, data: RunData, model: Transformer,
                 device: torch.device, dist_info: DistInfo = DistInfo()):
        self.cfg, self.run, self.data, self.model, self.device = cfg, run, data, model, device
        self.dist = dist_info
        t = cfg.train
        model.set_recompute(t.recompute)
        # Training runs through the DDP wrapper (gradient all-reduce); everything else, from
        # validation to checkpoints, uses the plain module.
        self.train_model: torch.nn.Module = BatchLoss(model)
        if dist_info.enabled:
            self.train_model = torch.nn.parallel.DistributedDataParallel(
                self.train_model, device_ids=[device.index] if device.type == "cuda" else None)
        # fused: one kernel per step instead of ~10 passes over every parameter; on a CPU the
        # unfused Adam step took as long as the forward and backward passes together.
        self.optimizer = torch.optim.Adam(model.parameters(), lr=t.lr, betas=tuple(t.adam_betas),
                                          eps=t.adam_eps, weight_decay=t.weight_decay, fused=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: noam_factor(step + 1, t.warmup_steps))
        self.train_pairs, lengths = trainable_pairs(data.train, cfg.data.max_len)
        self.sampler = TokenBatchSampler(lengths, t.batch_tokens, t.seed,
                                         rank=dist_info.rank, world_size=dist_info.world_size)
        self.collator = Collator(data.src_codec, data.tgt_codec)
        self.valid_sampler = TokenBatchSampler(data.valid.lengths(), t.batch_tokens, t.seed,
                                               shuffle=False)
        self.translator = Translator(model, data.src_codec, data.tgt_codec, cfg.decode, device)
        self.pad_id = data.tgt_codec.pad_id
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.best_bleu = -1.0
        self.best_step = 0
        self.validation_bleu: dict[int, float] = {}   # step -> BLEU, for keep_best and patience
        self.bad_steps = 0            # consecutive steps skipped for a non-finite loss/gradient
        self.skipped_steps = 0
        self.writer: SummaryWriter | None = None

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            "best_bleu": self.best_bleu, "best_step": self.best_step,
            "validation_bleu": [[step, bleu] for step, bleu in self.validation_bleu.items()],
            "bad_steps": self.bad_steps, "skipped_steps": self.skipped_steps,
            "rng": rng_state(),
            "world_size": self.dist.world_size,
            "config": self.cfg.to_dict(),
            "vocab": {"src": self.data.src_codec.vocab_size, "tgt": self.data.tgt_codec.vocab_size},
            "tokenizers": {"src": self.data.src_codec.to_str(),
                           "tgt": self.data.tgt_codec.to_str()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        # Checkpoints from before fused Adam say fused=None: load them fused too (which also
        # moves their step counters to the parameters' device, as the fused kernel needs).
        for group in state["optimizer"]["param_groups"]:
            group["fused"] = True
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        # Safe changes on resume (a new peak lr or warm-up) take effect from here on.
        warmup = self.cfg.train.warmup_steps
        self.scheduler.base_lrs = [self.cfg.train.lr for _ in self.scheduler.base_lrs]
        self.scheduler.lr_lambdas = [lambda s: noam_factor(s + 1, warmup)]
        lr = self.cfg.train.lr * noam_factor(self.scheduler.last_epoch + 1, warmup)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.step, self.epoch = state["step"], state["epoch"]
        self.batch_in_epoch = state["batch_in_epoch"]
        self.best_bleu, self.best_step = state["best_bleu"], state["best_step"]
        self.validation_bleu = {int(step): bleu for step, bleu in state["validation_bleu"]}
        self.bad_steps, self.skipped_steps = state["bad_steps"], state["skipped_steps"]
        saved_world = state.get("world_size", 1)
        if saved_world != self.dist.world_size:
            raise TmtError(f"cannot resume: the checkpoint was written by {saved_world} "
                           f"process(es) and this run has {self.dist.world_size}; the batch plan "
                           f"and random states are per process, so resume with "
                           f"--nproc_per_node={saved_world} (in all) for an exact continuation")
        set_rng_state(state["rng_ranks"][self.dist.rank] if "rng_ranks" in state else state["rng"])

    def save_checkpoint(self, best: bool = False) -> None:
        """Called on every rank (it gathers their random states); only rank 0 writes."""
        rng_ranks = gather_to_main(rng_state())
        checksums = gather_to_main(self._parameter_checksum())
        if not self.dist.is_main:
            return
        if len(set(checksums)) > 1:
            # DDP keeps replicas equal by construction; if they ever differ, stop rather than
            # checkpoint one replica of a diverged job (fairseq checks the same at each step).
            raise TmtError(f"parameters differ between ranks at step {self.step} "
                           f"(checksums {checksums}); the last good checkpoint is {self.run.last}")
        state = self.state_dict()
        if self.dist.enabled:
            state["rng_ranks"] = rng_ranks
            state["rank_parameter_checksums"] = checksums
        # best.pt before last.pt: if we die in between, the resumed run (from the older last.pt)
        # validates again and rewrites best.pt, so the two never disagree.
        if best:
            atomic_save(state, self.run.best)
        size = atomic_save(state, self.run.last)
        snapshot = self.run.checkpoints / step_checkpoint_name(self.step)
        snapshot.unlink(missing_ok=True)
        snapshot.hardlink_to(self.run.last)      # a second name for the same bytes: no extra I/O
        # Older files go only now that the new one is safely on disk.
        rotate(self.run.checkpoints, self.cfg.train.keep_last, self.cfg.train.keep_best,
               self.validation_bleu)
        log.info("checkpoint at step %d: %s (%s)%s", self.step, self.run.last, human_size(size),
                 ", new best" if best else "")

    def _parameter_checksum(self) -> float:
        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.model.parameters()))

    # ------------------------------------------------------------------ steps

    def _forward_loss(self, batch: Batch, model: torch.nn.Module | None = None) -> torch.Tensor:
        with autocast(self.device):
            return (model or self.model.loss)(batch, self.pad_id, self.cfg.train.label_smoothing)

    def train_step(self, batches: list[Batch]) -> tuple[float, float, int]:
        """One optimizer step over `batches` (gradient accumulation); the loss is averaged over
        all their real target tokens. A non-finite loss or gradient skips the update.
        Returns (loss per token, grad norm, tokens)."""
        self.model.train()
        # Normalise by the real target tokens of all ranks: DDP averages gradients over ranks,
        # so scaling by world_size turns that average into the sum over the global batch.
        tokens = int(sum_across_ranks(sum(b.n_tokens for b in batches), self.device))
        scale = self.dist.world_size / tokens
        total = 0.0
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            # Accumulation steps skip DDP's gradient all-reduce; the last one does it once.
            sync = self.train_model.no_sync() if self.dist.enabled and not last else \
                contextlib.nullcontext()
            with sync:
                loss = self._forward_loss(batch.to(self.device), self.train_model)
                (loss * scale).backward()
            total += loss.item()
        total = sum_across_ranks(total, self.device)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.cfg.train.clip_norm or float("inf")))
        if math.isfinite(total) and math.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()
            self.bad_steps = 0
        else:
            self.bad_steps += 1
            self.skipped_steps += 1
            log.warning("step %d: non-finite %s, update skipped (%d in a row, %d in all)",
                        self.step + 1, "loss" if not math.isfinite(total) else "gradient",
                        self.bad_steps, self.skipped_steps)
        self.optimizer.zero_grad(set_to_none=True)
        return total / tokens, grad_norm, tokens

    @torch.no_grad()
    def validate(self) -> dict:
        self.model.eval()
        loss_sum, tokens = 0.0, 0
        self.valid_sampler.set_epoch(0)
        for batch in make_loader(self.data.valid, self.valid_sampler, self.collator):
            loss_sum += self._forward_loss(batch.to(self.device)).item()
            tokens += batch.n_tokens
        valid = self.data.splits.valid.select(range(min(self.cfg.decode.valid_sentences,
                                                        len(self.data.splits.valid))))
        hypotheses = self.translator.translate(valid["src"])
        scores = corpus_scores(hypotheses, valid["tgt"])
        loss = loss_sum / max(tokens, 1)
        samples = [(s, r, h) for s, r, h in zip(valid["src"], valid["tgt"], hypotheses)]
        return {"loss": loss, "ppl": math.exp(min(loss, 50)), "bleu": scores.bleu,
                "chrf": scores.chrf, "samples": samples[:SAMPLE_TRANSLATIONS]}

    # ------------------------------------------------------------------ loop

    def _step_groups(self) -> Iterator[list[Batch]]:
        """The rest of the current epoch, `accumulate` batches at a time."""
        self.sampler.set_epoch(self.epoch, self.batch_in_epoch)
        batches = iter(make_loader(self.train_pairs, self.sampler, self.collator,
                                   self.cfg.train.num_workers))
        while group := list(itertools.islice(batches, self.cfg.train.accumulate)):
            yield group

    def _log_train(self, loss: float, lr: float, grad_norm: float, tokens_per_s: float) -> None:
        if self.writer is None:
            return
        log.info("step %d: loss %.3f, lr %.2e, grad norm %.2f, %.0f tokens/s", self.step, loss,
                 lr, grad_norm, tokens_per_s)
        for key, value in (("loss", loss), ("lr", lr), ("grad_norm", grad_norm),
                           ("tokens_per_s", tokens_per_s)):
            self.writer.add_scalar(f"train/{key}", value, self.step)

    def _log_validation(self, metrics: dict) -> None:
        log.info("validation at step %d: loss %.3f, ppl %.2f, BLEU %.2f, chrF %.2f", self.step,
                 metrics["loss"], metrics["ppl"], metrics["bleu"], metrics["chrf"])
        if self.writer:
            for key in ("loss", "ppl", "bleu", "chrf"):
                self.writer.add_scalar(f"valid/{key}", metrics[key], self.step)
            text = "\n\n".join(f"**src** {s}  \n**ref** {r}  \n**hyp** {h}"
                               for s, r, h in metrics["samples"])
            self.writer.add_text("valid/samples", text, self.step)
            for i, (source, _, _) in enumerate(metrics["samples"]):
                alignment = cross_attention(self.translator, source)
                self.writer.add_figure(f"valid/attention/{i}", attention_figure(alignment),
                                       self.step)

    def _validate_and_checkpoint(self) -> None:
        """Rank 0 validates; every rank receives its BLEU, so all make the same best/stop
        decisions and keep identical trainer state."""
        bleu = None
        if self.dist.is_main:
            metrics = self.validate()
            self._log_validation(metrics)
            bleu = metrics["bleu"]
        bleu = broadcast_from_main(bleu)
        self.validation_bleu[self.step] = bleu
        improved = bleu > self.best_bleu
        if improved:
            self.best_bleu, self.best_step = bleu, self.step
        self.save_checkpoint(best=improved)

    def _patience_exhausted(self) -> bool:
        patience = self.cfg.train.patience
        if patience is None:
            return False
        later = [step for step in self.validation_bleu if step > self.best_step]
        return len(later) >= patience

    def _stop_reason(self, total: int) -> str | None:
        """Why the run should stop after the current step, or None to go on."""
        if self.step >= total:
            return "max_steps"
        if self.bad_steps >= self.cfg.train.max_bad_steps:
            return "faults"
        if self._patience_exhausted():
            return "patience"
        return None

    def total_steps(self) -> int:
        t = self.cfg.train
        by_epochs = t.max_epochs * math.ceil(len(self.sampler.batches(0)) / t.accumulate)
        return min(t.max_steps, by_epochs) if t.max_steps is not None else by_epochs

    def train(self) -> int:
        """Train until max_steps/max_epochs, early stopping, repeated numerical faults or a stop
        signal. Returns the process exit code."""
        t = self.cfg.train
        total = self.total_steps()
        if self.step >= total:
            log.info("no step to train: the run is at step %d of %d (train.max_steps %s, "
                     "train.max_epochs %d); its data and tokenizers are ready in %s", self.step,
                     total, t.max_steps, t.max_epochs, self.run.path)
            return 0
        if self.dist.is_main:
            check_writable(self.run.checkpoints)
            # Events after the checkpoint are replayed by this run: drop the stale ones.
            self.writer = SummaryWriter(str(self.run.tensorboard), purge_step=self.step + 1)
        bar = tqdm(total=total, initial=self.step, desc="train", unit="step", dynamic_ncols=True,
                   mininterval=1.0, disable=not self.dist.is_main)
        window_loss = window_tokens = window_seconds = 0.0
        last_saved = self.step
        reason = None
        with StopRequest() as stop:
            while reason is None and self.epoch < t.max_epochs:
                epoch_finished = True
                for group in self._step_groups():
                    started = time.perf_counter()
                    loss, grad_norm, tokens = self.train_step(group)
                    window_seconds += time.perf_counter() - started
                    self.step += 1
                    self.batch_in_epoch += len(group)
                    if math.isfinite(loss):
                        window_loss += loss * tokens
                        window_tokens += tokens
                    lr = self.optimizer.param_groups[0]["lr"]
                    bar.update(1)
                    bar.set_postfix(epoch=self.epoch, loss=f"{loss:.3f}", lr=f"{lr:.2e}",
                                    tok_s=f"{window_tokens / max(window_seconds, 1e-9):.0f}",
                                    refresh=False)
                    if self.step % t.log_every == 0 and window_tokens:
                        self._log_train(window_loss / window_tokens, lr, grad_norm,
                                        window_tokens / window_seconds)
                        window_loss = window_tokens = window_seconds = 0.0
                    if self.bad_steps == 0 and self.step % t.valid_every == 0:
                        self._validate_and_checkpoint()
                        last_saved = self.step
                    elif self.bad_steps == 0 and self.step % t.checkpoint_every == 0:
                        self.save_checkpoint()
                        last_saved = self.step
                    # Every rank must stop at the same step, whichever received the signal.
                    signalled = any_rank(stop.signal is not None, self.device)
                    reason = self._stop_reason(total) or ("signal" if signalled else None)
                    if reason:
                        epoch_finished = False
                        break
                if epoch_finished:
                    self.epoch += 1
                    self.batch_in_epoch = 0
            bar.close()
            # A finished run always ends validated, so it has a best.pt and a best score.
            if reason in (None, "max_steps") and self.step not in self.validation_bleu:
                self._validate_and_checkpoint()
            elif reason == "signal" and last_saved != self.step:
                self.save_checkpoint()
        if self.writer:
            self.writer.close()
        return self._report_end(reason, stop.signal)

    def _report_end(self, reason: str | None, signum: int | None) -> int:
        if reason == "signal":
            log.info("stopped at step %d; resume with: tmt train --run-dir %s --resume",
                     self.step, self.run.path)
            return 130 if signum in (signal.SIGINT, None) else 143
        if reason == "faults":
            last_good = (f"the last good checkpoint is {self.run.last} (lower train.lr or check "
                         f"the data, then resume)" if self.run.last.is_file() else
                         "no checkpoint was written yet (lower train.lr or check the data, then "
                         "start again)")
            log.error("stopping: %d consecutive steps up to step %d had a non-finite loss or "
                      "gradient; %s", self.bad_steps, self.step, last_good)
            return 1
        if reason == "patience":
            log.info("early stopping at step %d: no better validation BLEU in %d validations",
                     self.step, self.cfg.train.patience)
        log.info("finished at step %d (epoch %d); best valid BLEU %.2f at step %d", self.step,
                 self.epoch, self.best_bleu, self.best_step)
        return 0

"""The Trainer: label-smoothed loss, Adam with the Noam schedule, accumulation, clipping,
validation with BLEU/chrF, TensorBoard, checkpoints and exact resume."""

from __future__ import annotations

import itertools
import logging
import math
import signal
import time
from pathlib import Path
from typing import Iterator

import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from .batching import Batch, Collator, TokenBatchSampler, make_loader
from .checkpoint import atomic_save, human_size, rng_state, rotate, set_rng_state, \
    step_checkpoint_name
from .config import Config
from .device import autocast
from .evaluate import corpus_scores
from .loss import projected_label_smoothed_loss
from .model import Transformer
from .run import RunData, RunDir
from .translator import Translator

log = logging.getLogger(__name__)

SAMPLE_TRANSLATIONS = 5


def noam_factor(step: int, warmup: int) -> float:
    """Linear warm-up to the peak rate at `warmup`, then decay ∝ 1/√step (Vaswani et al.),
    scaled so that train.lr is the peak learning rate."""
    step = max(step, 1)
    return min(step / warmup, math.sqrt(warmup / step))


def label_smoothed_loss(hidden: torch.Tensor, labels: torch.Tensor, projection: torch.nn.Linear,
                        pad_id: int, smoothing: float) -> torch.Tensor:
    """Summed cross-entropy over real target tokens of the decoder states `hidden` (B, T, d).
    Only real positions are projected to the vocabulary, so padding costs nothing; projection
    and loss are fused (transformer_mt.loss) so the logits are never held whole."""
    real = labels != pad_id
    return projected_label_smoothed_loss(hidden[real], projection.weight, projection.bias,
                                         labels[real], smoothing)


class StopRequest:
    """First SIGINT/SIGTERM: stop after the current step and checkpoint. Second: exit at once
    (checkpoints are written atomically, so that is safe too)."""

    def __init__(self):
        self.signal: int | None = None
        self._previous = {}

    def __enter__(self) -> "StopRequest":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signum
        tqdm.write(f"{signal.Signals(signum).name}: finishing the current step and saving a "
                   f"checkpoint (press Ctrl-C again to quit at once)")


class Trainer:
    def __init__(self, cfg: Config, run: RunDir, data: RunData, model: Transformer,
                 device: torch.device):
        self.cfg, self.run, self.data, self.model, self.device = cfg, run, data, model, device
        t = cfg.train
        # fused: one kernel per step instead of ~10 passes over every parameter; on a CPU the
        # unfused Adam step took as long as the forward and backward passes together.
        self.optimizer = torch.optim.Adam(model.parameters(), lr=t.lr, betas=tuple(t.adam_betas),
                                          eps=t.adam_eps, weight_decay=t.weight_decay, fused=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: noam_factor(step + 1, t.warmup_steps))
        self.sampler = TokenBatchSampler(data.train.lengths(), t.batch_tokens, t.seed)
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
        self.writer: SummaryWriter | None = None

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            "best_bleu": self.best_bleu, "best_step": self.best_step,
            "rng": rng_state(),
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
        set_rng_state(state["rng"])

    def save_checkpoint(self, best: bool = False) -> None:
        state = self.state_dict()
        size = atomic_save(state, self.run.last)
        snapshot = self.run.checkpoints / step_checkpoint_name(self.step)
        snapshot.unlink(missing_ok=True)
        snapshot.hardlink_to(self.run.last)      # a second name for the same bytes: no extra I/O
        rotate(self.run.checkpoints, self.cfg.train.keep_last)
        if best:
            atomic_save(state, self.run.best)
        log.info("checkpoint at step %d: %s (%s)%s", self.step, self.run.last, human_size(size),
                 ", new best" if best else "")

    # ------------------------------------------------------------------ steps

    def _forward_loss(self, batch: Batch) -> torch.Tensor:
        with autocast(self.device):
            hidden = self.model.decoder_states(batch.src, batch.tgt_in, batch.src_mask,
                                               batch.tgt_mask)
            return label_smoothed_loss(hidden, batch.tgt_out, self.model.projection, self.pad_id,
                                       self.cfg.train.label_smoothing)

    def train_step(self, batches: list[Batch]) -> tuple[float, float, int]:
        """One optimizer step over `batches` (gradient accumulation); the loss is averaged over
        all their real target tokens. Returns (loss per token, grad norm, tokens)."""
        self.model.train()
        tokens = sum(b.n_tokens for b in batches)
        total = 0.0
        for batch in batches:
            loss = self._forward_loss(batch.to(self.device))
            (loss / tokens).backward()
            total += loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.cfg.train.clip_norm or float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return total / tokens, float(grad_norm), tokens

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
        hypotheses = self.translator.translate(valid["src"], self.cfg.decode.beam_size,
                                               self.cfg.decode.length_penalty)
        scores = corpus_scores(hypotheses, valid["tgt"])
        loss = loss_sum / max(tokens, 1)
        samples = [(s, r, h) for s, r, h in zip(valid["src"], valid["tgt"], hypotheses)]
        return {"loss": loss, "ppl": math.exp(min(loss, 50)), "bleu": scores.bleu,
                "chrf": scores.chrf, "samples": samples[:SAMPLE_TRANSLATIONS]}

    # ------------------------------------------------------------------ loop

    def _step_groups(self) -> Iterator[list[Batch]]:
        """The rest of the current epoch, `accumulate` batches at a time."""
        self.sampler.set_epoch(self.epoch, self.batch_in_epoch)
        loader = make_loader(self.data.train, self.sampler, self.collator,
                             self.cfg.train.num_workers)
        # A private generator keeps the DataLoader from drawing on the global RNG, which would
        # shift dropout masks after a resume.
        loader.generator = torch.Generator()
        batches = iter(loader)
        while group := list(itertools.islice(batches, self.cfg.train.accumulate)):
            yield group

    def _log_train(self, loss: float, lr: float, grad_norm: float, tokens_per_s: float) -> None:
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

    def _validate_and_checkpoint(self) -> None:
        metrics = self.validate()
        self._log_validation(metrics)
        improved = metrics["bleu"] > self.best_bleu
        if improved:
            self.best_bleu, self.best_step = metrics["bleu"], self.step
        self.save_checkpoint(best=improved)

    def total_steps(self) -> int:
        t = self.cfg.train
        by_epochs = t.max_epochs * math.ceil(len(self.sampler.batches(0)) / t.accumulate)
        return min(t.max_steps, by_epochs) if t.max_steps is not None else by_epochs

    def train(self) -> int:
        """Train until max_steps/max_epochs or a stop signal. Returns the process exit code."""
        t = self.cfg.train
        total = self.total_steps()
        self.writer = SummaryWriter(str(self.run.tensorboard), purge_step=self.step or None)
        bar = tqdm(total=total, initial=self.step, desc="train", unit="step", dynamic_ncols=True,
                   mininterval=1.0)
        window_loss = window_tokens = window_seconds = 0.0
        last_saved = self.step
        with StopRequest() as stop:
            while self.step < total and self.epoch < t.max_epochs and stop.signal is None:
                epoch_finished = True
                for group in self._step_groups():
                    started = time.perf_counter()
                    loss, grad_norm, tokens = self.train_step(group)
                    window_seconds += time.perf_counter() - started
                    self.step += 1
                    self.batch_in_epoch += len(group)
                    window_loss += loss * tokens
                    window_tokens += tokens
                    lr = self.optimizer.param_groups[0]["lr"]
                    bar.update(1)
                    bar.set_postfix(epoch=self.epoch, loss=f"{loss:.3f}", lr=f"{lr:.2e}",
                                    tok_s=f"{window_tokens / max(window_seconds, 1e-9):.0f}",
                                    refresh=False)
                    if self.step % t.log_every == 0:
                        self._log_train(window_loss / window_tokens, lr, grad_norm,
                                        window_tokens / window_seconds)
                        window_loss = window_tokens = window_seconds = 0.0
                    if self.step % t.valid_every == 0:
                        self._validate_and_checkpoint()
                        last_saved = self.step
                    elif self.step % t.checkpoint_every == 0:
                        self.save_checkpoint()
                        last_saved = self.step
                    if self.step >= total or stop.signal is not None:
                        epoch_finished = False
                        break
                if epoch_finished:
                    self.epoch += 1
                    self.batch_in_epoch = 0
            bar.close()
            if stop.signal is not None:
                if last_saved != self.step:
                    self.save_checkpoint()
                log.info("stopped at step %d; resume with: tmt train --run-dir %s --resume",
                         self.step, self.run.path)
                self.writer.close()
                return 130 if stop.signal == signal.SIGINT else 143
            if last_saved != self.step:
                self._validate_and_checkpoint()
        self.writer.close()
        log.info("finished at step %d (epoch %d); best valid BLEU %.2f at step %d", self.step,
                 self.epoch, self.best_bleu, self.best_step)
        return 0

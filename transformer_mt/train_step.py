"""One optimizer step: the label-smoothed loss over a group of batches (gradient accumulation),
backward, clipping, and Adam at the learning rate of the Noam schedule (optionally decayed to
zero at the end), a pure function of the number of updates applied (as nanoGPT's `get_lr`):
nothing about the schedule is checkpointed."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from .batching import Batch
from .config import Config, TrainConfig
from .device import autocast
from .distributed import DistInfo, sum_across_ranks
from .loss import BatchLoss
from .model import Transformer


def noam_factor(step: int, warmup: int) -> float:
    """Linear warm-up to the peak rate at `warmup`, then decay ∝ 1/√step (Vaswani et al.),
    scaled so that train.lr is the peak learning rate."""
    step = max(step, 1)
    return min(step / warmup, math.sqrt(warmup / step))


def decay_factor(updates: int, max_steps: int | None, decay_steps: int | None) -> float:
    """1 until the last `decay_steps` updates before `max_steps`, then a straight line to zero
    (the last update still moves, at 1/decay_steps of the rate): warm-up, stable, decay (Hägele
    et al. 2024, "Scaling laws and compute-optimal training beyond fixed training durations").
    Measured here (README): the last checkpoint becomes as good as an average of the last
    ones, no better than that average."""
    if decay_steps is None or max_steps is None:
        return 1.0
    return min(1.0, max(max_steps - updates, 0) / decay_steps)


def learning_rate(cfg: TrainConfig, updates: int) -> float:
    """The rate of the update that follows `updates` applied ones. A pure function of the step,
    so nothing about the schedule is checkpointed, and a resume with a new train.lr,
    train.warmup_steps, train.decay_steps or --max-steps follows the new schedule from its
    next step."""
    return (cfg.lr * noam_factor(updates + 1, cfg.warmup_steps)
            * decay_factor(updates, cfg.max_steps, cfg.decay_steps))


@dataclass
class StepResult:
    loss: float          # per real target token, over all ranks
    grad_norm: float
    tokens: int          # real target tokens, over all ranks
    applied: bool        # False: a non-finite loss or gradient, and the update was skipped


class TrainStep:
    """One optimizer step over a group of batches (gradient accumulation), data-parallel under
    torchrun: what `tmt train` takes and scripts/bench.py times."""

    def __init__(self, cfg: Config, model: Transformer, device: torch.device, pad_id: int,
                 dist_info: DistInfo = DistInfo()):
        t = cfg.train
        self.cfg, self.model, self.device, self.pad_id, self.dist = cfg, model, device, pad_id, \
            dist_info
        model.set_recompute(t.recompute)
        # Training runs through the DDP wrapper (gradient all-reduce); everything else, from
        # validation to checkpoints, uses the plain module.
        self.batch_loss = BatchLoss(model)
        self.train_model: torch.nn.Module = self.batch_loss
        if dist_info.enabled:
            self.train_model = torch.nn.parallel.DistributedDataParallel(
                self.batch_loss, device_ids=[device.index] if device.type == "cuda" else None)
        # fused: one kernel per step instead of ~10 passes over every parameter; on a CPU the
        # unfused Adam step took as long as the forward and backward passes together.
        self.optimizer = torch.optim.Adam(model.parameters(), lr=t.lr, betas=tuple(t.adam_betas),
                                          eps=t.adam_eps, weight_decay=t.weight_decay, fused=True)

    def loss(self, batch: Batch, model: torch.nn.Module | None = None) -> torch.Tensor:
        """The summed label-smoothed loss of `batch` (on the device already)."""
        with autocast(self.device):
            return (model or self.batch_loss)(batch, self.pad_id, self.cfg.train.label_smoothing)

    def __call__(self, batches: list[Batch], updates: int) -> StepResult:
        """The step after `updates` applied updates; the loss is averaged over all the real
        target tokens of `batches`. A non-finite loss or gradient skips the update."""
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
                loss = self.loss(batch.to(self.device), self.train_model)
                (loss * scale).backward()
            total += loss.item()
        total = sum_across_ranks(total, self.device)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.cfg.train.clip_norm or float("inf")))
        applied = math.isfinite(total) and math.isfinite(grad_norm)
        if applied:
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate(self.cfg.train, updates)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(total / tokens, grad_norm, tokens, applied)

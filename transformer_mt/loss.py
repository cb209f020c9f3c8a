"""The training loss: label-smoothed cross-entropy over the real (not padding) target tokens,
fused with the output projection and chunked over tokens. `Transformer.loss` is its one entry.

The usual path materialises the (tokens × vocabulary) logits, their log-softmax, the one-hot
gradient of the loss and the gradient of the log-softmax: with 4k tokens and a 16k vocabulary
that is ~260 MB each, several passes through memory per step, and most of the peak memory of a
training step. Here the logits of one chunk of tokens at a time are computed, turned into the
loss and, when gradients are needed, straight into the gradients of the hidden states, the
weight and the bias, which the backward pass then only scales. Results equal
`F.cross_entropy(hidden @ weight.T + bias, labels, label_smoothing=ε, reduction="sum")` up to
float rounding (tested).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from .batching import Batch

# Tokens per chunk: their logits (CHUNK × vocabulary floats) stay small enough to be reused from
# cache between the loss and gradient passes, while the weight is still read in few large GEMMs.
# The loss runs when every activation of the step is alive, so its buffers add to the peak
# memory: 256 tokens × 16,000 words is 16 MB per buffer (512 cost 47 MB more at the peak of a
# 4,096-token step, for no measurable speed).
CHUNK_TOKENS = 256


class _ProjectedLabelSmoothedCE(torch.autograd.Function):
    # Under CUDA autocast the matmuls run in bf16 like the model's other linear layers; the
    # softmax, the loss and the gradient sums are always float32.
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.bfloat16)
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                labels: torch.Tensor, smoothing: float, need_grads: bool) -> torch.Tensor:
        vocab = weight.size(0)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_grads else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_grads else None
        grad_bias = (torch.zeros(vocab, dtype=torch.float32, device=hidden.device)
                     if need_grads and bias is not None else None)
        weight_t = weight.t()
        for start in range(0, hidden.size(0), CHUNK_TOKENS):
            h = hidden[start:start + CHUNK_TOKENS]
            y = labels[start:start + CHUNK_TOKENS, None]
            logits = h @ weight_t if bias is None else torch.addmm(bias, h, weight_t)
            log_probs = logits.float().log_softmax(dim=1)
            del logits          # before the next chunk's: at most two chunk buffers alive
            # Smoothed -log p(y): (1-ε)·(-log p_y) + ε·mean_v(-log p_v)
            total -= ((1 - smoothing) * log_probs.gather(1, y).sum()
                      + smoothing / vocab * log_probs.sum())
            if not need_grads:
                continue
            # d loss / d logits = softmax - (1-ε)·onehot(y) - ε/V, in place of the log-probs.
            grad = log_probs.exp_().sub_(smoothing / vocab)
            grad.scatter_add_(1, y, grad.new_full(y.shape, -(1 - smoothing)))
            if grad_bias is not None:
                grad_bias += grad.sum(dim=0)
            grad = grad.to(h.dtype)
            torch.mm(grad, weight, out=grad_hidden[start:start + CHUNK_TOKENS])
            if grad.dtype == grad_weight.dtype:
                grad_weight.addmm_(grad.t(), h)
            else:
                grad_weight += (grad.t() @ h).float()
            del log_probs, grad
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        return total

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_output: torch.Tensor):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        # Scaled in place: the gradients were made for this one use (a second backward through
        # a retained graph is not supported), and new tensors would add the projection's size
        # (33 MB at 16,000 × 512) to the memory peak of the backward pass.
        return (grad_hidden.mul_(grad_output.to(grad_hidden.dtype)), grad_weight.mul_(grad_output),
                None if grad_bias is None else grad_bias.mul_(grad_output), None, None, None)


def projected_label_smoothed_loss(hidden: torch.Tensor, weight: torch.Tensor,
                                  bias: torch.Tensor | None, labels: torch.Tensor,
                                  smoothing: float) -> torch.Tensor:
    """Summed label-smoothed cross-entropy of `hidden @ weight.T + bias` against `labels`.

    hidden: (N, d) states of the positions to score (no padding); weight: (V, d); labels: (N,).
    """
    # Known here, not inside forward (which always runs without grad mode): under no_grad, as in
    # validation, the gradient work is skipped.
    need_grads = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias))
    return _ProjectedLabelSmoothedCE.apply(hidden, weight, bias, labels, smoothing, need_grads)


def label_smoothed_loss(hidden: torch.Tensor, labels: torch.Tensor, projection: nn.Linear,
                        pad_id: int, smoothing: float) -> torch.Tensor:
    """Summed label-smoothed cross-entropy over the real target tokens of the decoder states
    `hidden` (B, T, d) against `labels` (B, T). Only real positions are projected to the
    vocabulary, so padding costs nothing, and never all at once (see above)."""
    real = labels != pad_id
    return projected_label_smoothed_loss(hidden[real], projection.weight, projection.bias,
                                         labels[real], smoothing)


class BatchLoss(nn.Module):
    """`model.loss` as a module's forward: what a training step calls. DistributedDataParallel
    arms its gradient all-reduce in the forward of the module it wraps, so it wraps this one and
    sees the whole loss, the projection included (as PyTorch Lightning wraps `training_step`)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch: Batch, pad_id: int, smoothing: float) -> torch.Tensor:
        return self.model.loss(batch, pad_id, smoothing)

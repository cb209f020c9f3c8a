"""Dropout with a cheaper random mask on CPU.

torch's CPU dropout draws one Bernoulli sample per element from a serial Mersenne Twister: with
the model's ~30 dropouts that was 12% of a training step's CPU time. Here one 64-bit draw gives
four 16-bit uniform integers, compared with a threshold: the mask costs ~4x less. The drop
probability is rounded to a multiple of 1/65536 (0.1 becomes 0.100006) and the scale matches it,
so the expected output still equals the input. Other devices keep torch's fused kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_LEVELS = 1 << 16


def keep_mask(shape: torch.Size, p: float, dtype: torch.dtype) -> torch.Tensor:
    """0 with probability ≈ p, else 1 / (1 - p), drawn from torch's (seeded) generator."""
    dropped_levels = round(p * _LEVELS)
    numel = shape.numel()
    words = torch.empty((numel + 3) // 4, dtype=torch.int64)
    uniform16 = words.random_(-2 ** 63, None).view(torch.int16)[:numel].view(shape)
    keep = uniform16 >= dropped_levels - _LEVELS // 2
    return keep.to(dtype).mul_(_LEVELS / (_LEVELS - dropped_levels))


class Dropout(nn.Module):
    """Drop-in for nn.Dropout (same behaviour in eval mode and for p = 0)."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        return x * keep_mask(x.shape, self.p, x.dtype)

    def extra_repr(self) -> str:
        return f"p={self.p}"

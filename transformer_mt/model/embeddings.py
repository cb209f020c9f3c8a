"""Token embeddings scaled by √d_model, and the sinusoidal positional encoding of the paper."""

from __future__ import annotations

import math

import torch
from torch import nn

from .dropout import Dropout


class InputEmbeddings(nn.Module):
    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids) * math.sqrt(self.d_model)


def sinusoidal_table(length: int, d_model: int) -> torch.Tensor:
    """(length, d_model): PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32)
                         * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)[:, :d_model // 2]
    return table


class PositionalEncoding(nn.Module):
    """Adds positions to embeddings. The table grows on demand, so no sentence is ever too long."""

    def __init__(self, d_model: int, dropout: float, initial_length: int = 512):
        super().__init__()
        self.d_model = d_model
        self.dropout = Dropout(dropout)
        # Not persistent: it is a pure function of the length, so checkpoints need not carry it.
        self.register_buffer("table", sinusoidal_table(initial_length, d_model), persistent=False)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """x: (B, T, d_model), the embeddings of positions start..start+T-1."""
        end = start + x.size(1)
        if end > self.table.size(0):
            self.table = sinusoidal_table(max(end, 2 * self.table.size(0)), self.d_model).to(
                self.table.device)
        return self.dropout(x + self.table[start:end].to(x.dtype))

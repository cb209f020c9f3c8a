"""Multi-head attention with separate W_q, W_k, W_v and W_o, on boolean masks (True = may attend)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .dropout import Dropout


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       mask: torch.Tensor | None, dropout: Dropout | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(QKᵀ/√d_k)V as the paper writes it; also returns the attention weights."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, dropout: float, implementation: str = "sdpa"):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by heads ({heads})")
        self.heads, self.d_k = heads, d_model // heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout_p = dropout
        self.dropout = Dropout(dropout)
        self.implementation = implementation
        self.keep_weights = False      # set to record attention weights (for plots)
        self.last_weights: torch.Tensor | None = None

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) -> (B, heads, T, d_k)"""
        return x.view(x.size(0), x.size(1), self.heads, self.d_k).transpose(1, 2)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values for x, split into heads; decoders cache these."""
        return self._split_heads(self.w_k(x)), self._split_heads(self.w_v(x))

    def attend(self, query_input: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        q = self._split_heads(self.w_q(query_input))
        if self.implementation == "explicit" or self.keep_weights:
            out, weights = explicit_attention(q, k, v, mask, self.dropout)
            self.last_weights = weights.detach() if self.keep_weights else None
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.dropout_p if self.training else 0.0)
        batch, _, length, _ = out.shape
        return self.w_o(out.transpose(1, 2).reshape(batch, length, self.heads * self.d_k))

    def forward(self, query_input: torch.Tensor, kv_input: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        return self.attend(query_input, *self.project_kv(kv_input), mask)

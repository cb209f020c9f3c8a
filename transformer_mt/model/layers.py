"""Feed-forward block, residual connection with layer norm, and the encoder and decoder stacks.

Each block owns its sub-layers (no shared or global modules). `norm="pre"` normalises each
sub-layer's input (x + f(norm(x)), stabler for deep stacks); `norm="post"` is the paper's
norm(x + f(x)).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .attention import MultiHeadAttention
from .dropout import Dropout, ReluDropout


class FeedForward(nn.Module):
    """Position-wise FFN(x) = W_2 · dropout(ReLU(W_1 x + b_1)) + b_2."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.linear_1 = nn.Linear(d_model, d_ff)
        self.linear_2 = nn.Linear(d_ff, d_model)
        self.relu_dropout = ReluDropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.relu_dropout(self.linear_1(x)))


class ResidualConnection(nn.Module):
    """Adds a sub-layer's (dropped-out) output to its input, with layer norm before or after."""

    def __init__(self, d_model: int, dropout: float, norm: str):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = norm == "pre"

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]
                ) -> torch.Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderBlock(nn.Module):
    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float, norm: str,
                 attention: str):
        super().__init__()
        self.self_attention = MultiHeadAttention(d_model, heads, dropout, attention)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.residuals = nn.ModuleList([ResidualConnection(d_model, dropout, norm)
                                        for _ in range(2)])

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        x = self.residuals[0](x, lambda h: self.self_attention(h, h, src_mask))
        return self.residuals[1](x, self.feed_forward)


class DecoderBlock(nn.Module):
    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float, norm: str,
                 attention: str):
        super().__init__()
        self.self_attention = MultiHeadAttention(d_model, heads, dropout, attention)
        self.cross_attention = MultiHeadAttention(d_model, heads, dropout, attention)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.residuals = nn.ModuleList([ResidualConnection(d_model, dropout, norm)
                                        for _ in range(3)])

    def forward(self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                tgt_mask: torch.Tensor | None, cache: dict | None = None) -> torch.Tensor:
        """With `cache` (`Transformer.new_cache`), x holds only the newest position(s): their
        keys and values are appended to the cached ones, and the cross-attention uses the
        cached keys/values of the encoder output instead of `memory`."""
        def self_attend(h: torch.Tensor) -> torch.Tensor:
            k, v = self.self_attention.project_kv(h)
            if cache is not None:
                if "self_k" in cache:
                    k = torch.cat([cache["self_k"], k], dim=2)
                    v = torch.cat([cache["self_v"], v], dim=2)
                cache["self_k"], cache["self_v"] = k, v
            return self.self_attention.attend(h, k, v, tgt_mask)

        def cross_attend(h: torch.Tensor) -> torch.Tensor:
            if cache is None:
                return self.cross_attention(h, memory, src_mask)
            # The cache holds one sentence's keys/values once; its rows in x (k consecutive
            # ones in beam search) query them together, as k positions of that sentence.
            sentences = cache["cross_k"].size(0)
            queries = h.reshape(sentences, -1, h.size(-1))
            return self.cross_attention.attend(queries, cache["cross_k"], cache["cross_v"],
                                               src_mask).reshape(h.shape)

        x = self.residuals[0](x, self_attend)
        x = self.residuals[1](x, cross_attend)
        return self.residuals[2](x, self.feed_forward)


def run_block(block: nn.Module, recompute: bool, *args) -> torch.Tensor:
    """block(*args); with `recompute` (training only), its activations are not kept for the
    backward pass but recomputed there from the block's input: memory for compute. The random
    state is replayed, so dropout draws the same masks the second time."""
    if recompute and block.training and torch.is_grad_enabled():
        return checkpoint(block, *args, use_reentrant=False)
    return block(*args)


class Encoder(nn.Module):
    def __init__(self, layers: int, d_model: int, norm: str, **block_args):
        super().__init__()
        self.recompute = False          # set by Transformer.set_recompute
        self.blocks = nn.ModuleList([EncoderBlock(d_model=d_model, norm=norm, **block_args)
                                     for _ in range(layers)])
        # Pre-norm leaves the residual stream un-normalised: one final norm closes the stack.
        self.final_norm = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = run_block(block, self.recompute, x, src_mask)
        return self.final_norm(x)


class Decoder(nn.Module):
    def __init__(self, layers: int, d_model: int, norm: str, **block_args):
        super().__init__()
        self.recompute = False
        self.blocks = nn.ModuleList([DecoderBlock(d_model=d_model, norm=norm, **block_args)
                                     for _ in range(layers)])
        self.final_norm = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()

    def forward(self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                tgt_mask: torch.Tensor | None, cache: list[dict] | None = None) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            if cache is None:
                x = run_block(block, self.recompute, x, memory, src_mask, tgt_mask)
            else:                      # incremental decoding: no gradients, nothing to recompute
                x = block(x, memory, src_mask, tgt_mask, cache[i])
        return self.final_norm(x)

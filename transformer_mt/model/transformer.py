"""The encoder-decoder Transformer of "Attention Is All You Need", built from a ModelConfig."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ..config import ModelConfig
from ..loss import label_smoothed_loss
from .embeddings import InputEmbeddings, PositionalEncoding
from .layers import Decoder, Encoder

if TYPE_CHECKING:
    from ..batching import Batch


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                 joint_vocab: bool = False):
        super().__init__()
        self.cfg = cfg
        block_args = dict(heads=cfg.heads, d_ff=cfg.d_ff, dropout=cfg.dropout,
                          attention=cfg.attention)
        self.src_embed = InputEmbeddings(src_vocab_size, cfg.d_model)
        self.tgt_embed = InputEmbeddings(tgt_vocab_size, cfg.d_model)
        self.src_pos = PositionalEncoding(cfg.d_model, cfg.dropout)
        self.tgt_pos = PositionalEncoding(cfg.d_model, cfg.dropout)
        self.encoder = Encoder(cfg.layers, cfg.d_model, cfg.norm, **block_args)
        self.decoder = Decoder(cfg.layers, cfg.d_model, cfg.norm, **block_args)
        self.projection = nn.Linear(cfg.d_model, tgt_vocab_size)
        self._init_parameters()
        if cfg.tie_embeddings:
            self.projection.weight = self.tgt_embed.embedding.weight
            if joint_vocab:
                # Both languages share one vocabulary: one matrix embeds and predicts every token.
                if src_vocab_size != tgt_vocab_size:
                    raise ValueError(f"a joint vocabulary needs equal sizes, got "
                                     f"{src_vocab_size} and {tgt_vocab_size}")
                self.src_embed.embedding.weight = self.tgt_embed.embedding.weight

    def _init_parameters(self) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def set_recompute(self, enabled: bool) -> None:
        """Recompute each encoder and decoder block's activations in the backward pass instead
        of keeping them (train.recompute)."""
        self.encoder.recompute = self.decoder.recompute = enabled

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.src_pos(self.src_embed(src)), src_mask)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
               tgt_mask: torch.Tensor | None, cache: list[dict] | None = None,
               start: int = 0) -> torch.Tensor:
        """Decoder states for target positions start..start+T-1 (T = tgt.size(1)). With a
        `cache`, src_mask has one row per sentence, as the cache's cross-attention entries."""
        return self.decoder(self.tgt_pos(self.tgt_embed(tgt), start), memory, src_mask,
                            tgt_mask, cache)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Logits over the target vocabulary."""
        return self.projection(x)

    def decoder_states(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor,
                       tgt_mask: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model): the decoder's output, before the projection (teacher forcing)."""
        return self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor,
                tgt_mask: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) with teacher forcing."""
        return self.project(self.decoder_states(src, tgt, src_mask, tgt_mask))

    def loss(self, batch: Batch, pad_id: int, smoothing: float) -> torch.Tensor:
        """Summed label-smoothed cross-entropy of the batch's real target tokens (`tgt_out` not
        `pad_id`), teacher forced; the logits are never held whole (transformer_mt/loss.py).
        Divide by `batch.n_tokens` for the loss per token."""
        hidden = self.decoder_states(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
        return label_smoothed_loss(hidden, batch.tgt_out, self.projection, pad_id, smoothing)

    def new_cache(self, memory: torch.Tensor) -> list[dict]:
        """A key/value cache for incremental decoding, one dict per decoder layer. The
        cross-attention keys/values of `memory` (B, S, d_model) are computed here, once per
        sentence; the decoder rows of a sentence (k consecutive ones in beam search) share
        them. The self-attention keys/values are appended by each decoding step."""
        return [dict(zip(("cross_k", "cross_v"), block.cross_attention.project_kv(memory)))
                for block in self.decoder.blocks]


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                joint_vocab: bool = False) -> Transformer:
    """`joint_vocab`: source and target share one tokenizer (tokenizer.type bpe); with
    cfg.tie_embeddings the source embedding is then tied too."""
    return Transformer(cfg, src_vocab_size, tgt_vocab_size, joint_vocab)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields tied ones once

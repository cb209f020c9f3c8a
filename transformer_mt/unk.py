"""Unknown words: copy the source word an output [UNK] stands for (OpenNMT-py's -replace_unk), and
count how often the vocabularies miss.

A word-level vocabulary maps every word it has not seen to [UNK] (names, numbers, rare words);
the model then emits [UNK] where that word's translation belongs. Each such [UNK] is replaced by
the source word that the last decoder layer's cross-attention, averaged over heads, weighs most
when the [UNK] is produced: names and numbers come across as they were written.

The weights are read after the search, by one teacher-forced decoder pass over the finished
output, for the outputs that contain an [UNK] only: the search keeps its fast path, and the
weights are those the decoder had at each step (the cached and uncached decoders agree).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .model import Transformer
from .model.masks import causal_mask, pad_sequences, source_tensor, src_pad_mask
from .tokenizer import TextCodec


@torch.no_grad()
def last_layer_cross_attention(model: Transformer, src: torch.Tensor, src_mask: torch.Tensor,
                               tgt_in: torch.Tensor) -> torch.Tensor:
    """(B, T, S): the last decoder layer's cross-attention weights, averaged over heads, for
    target inputs `tgt_in` ([SOS] output..., padded at the end) with teacher forcing."""
    attention = model.decoder.blocks[-1].cross_attention
    was_training = model.training
    model.eval()
    attention.keep_weights = True
    try:
        model.decoder_states(src, tgt_in, src_mask, causal_mask(tgt_in.size(1), src.device))
        return attention.last_weights.mean(dim=1)
    finally:
        attention.keep_weights, attention.last_weights = False, None
        model.train(was_training)


def attended_source_tokens(model: Transformer, src_ids: list[list[int]],
                           out_ids: list[list[int]], src_codec: TextCodec,
                           tgt_codec: TextCodec, device: torch.device) -> list[list[int]]:
    """For each output token, the index (into its `src_ids`) of the source token that the last
    decoder layer weighs most when producing it; [SOS], [EOS] and padding are never chosen."""
    src = source_tensor(src_ids, src_codec).to(device)
    src_mask = src_pad_mask(src, src_codec.pad_id)
    tgt_in = pad_sequences([[tgt_codec.sos_id, *ids] for ids in out_ids],
                           tgt_codec.pad_id).to(device)
    weights = last_layer_cross_attention(model, src, src_mask, tgt_in)
    positions = torch.arange(src.size(1), device=device)
    lengths = torch.tensor([len(ids) for ids in src_ids], device=device)
    words = (positions[None, :] >= 1) & (positions[None, :] <= lengths[:, None])   # (B, S)
    best = weights.masked_fill(~words[:, None, :], -1.0).argmax(dim=-1) - 1     # (B, T)
    return [row[:len(ids)] for row, ids in zip(best.tolist(), out_ids)]


def unknown_replacements(out_ids: list[int], alignment: list[int], source_pieces: list[str],
                         unk_id: int) -> dict[int, str]:
    """{position of each [UNK] in `out_ids`: the source piece it attends to}."""
    return {i: source_pieces[alignment[i]] for i, token in enumerate(out_ids) if token == unk_id}


@dataclass
class UnknownCounts:
    """How often the vocabularies miss, over a set of translated sentences."""
    sources: int = 0
    source_tokens: int = 0
    unknown_source_tokens: int = 0
    sources_with_unknown: int = 0
    outputs: int = 0
    outputs_with_unknown: int = 0        # before replacement

    def add_source(self, ids: list[int], unk_id: int) -> None:
        unknown = sum(1 for i in ids if i == unk_id)
        self.sources += 1
        self.source_tokens += len(ids)
        self.unknown_source_tokens += unknown
        self.sources_with_unknown += unknown > 0

    def add_output(self, ids: list[int], unk_id: int) -> None:
        self.outputs += 1
        self.outputs_with_unknown += unk_id in ids

    def shares(self) -> dict:
        """The shares reported by `tmt evaluate` (of distinct source sentences translated)."""
        def share(part: int, whole: int) -> float:
            return round(part / whole, 4) if whole else 0.0

        return {"unknown_source_tokens": share(self.unknown_source_tokens, self.source_tokens),
                "sources_with_unknown": share(self.sources_with_unknown, self.sources),
                "outputs_with_unk": share(self.outputs_with_unknown, self.outputs)}

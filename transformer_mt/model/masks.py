"""Masks and the tensors they are built from: padded id tensors and the boolean masks of the
encoder and decoder. One convention throughout: True where attention is allowed.

These are the model's inputs, shared by training batches (batching.py), decoding (search.py,
translator.py) and attention read-outs (unk.py); they need only torch.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

if TYPE_CHECKING:
    from ..tokenizer import TextCodec


def src_pad_mask(src: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, 1, 1, S): True for real source tokens; broadcasts over heads and query positions."""
    return (src != pad_id)[:, None, None, :]


def causal_mask(length: int, device: torch.device | None = None) -> torch.Tensor:
    """(T, T): position i may attend to positions 0..i."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def tgt_mask(tgt: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, 1, T, T): padding-and-causal mask for the decoder's self-attention."""
    return (tgt != pad_id)[:, None, None, :] & causal_mask(tgt.size(1), tgt.device)


def pad_sequences(sequences: Sequence[Sequence[int]], pad_id: int, first: int | None = None,
                  last: int | None = None) -> torch.Tensor:
    """(B, longest) int64: each row is `first`, the sequence, `last` (those given), then padding.

    Sequences are lists of ids or numpy arrays (read from a `TokenStore`); the
    batch is assembled in one numpy array, with no Python step per token."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    longest = int(lengths.max(initial=0))
    offset = int(first is not None)
    out = np.full((len(sequences), offset + longest + int(last is not None)), pad_id,
                  dtype=np.int64)
    if all(isinstance(s, np.ndarray) for s in sequences):
        ids = np.concatenate(sequences) if len(sequences) else np.zeros(0, dtype=np.int64)
    else:
        ids = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64,
                          count=int(lengths.sum()))
    # A boolean mask fills row after row, in the order of the concatenated ids.
    out[:, offset:offset + longest][np.arange(longest) < lengths[:, None]] = ids
    if first is not None:
        out[:, 0] = first
    if last is not None:
        out[np.arange(len(sequences)), offset + lengths] = last
    return torch.from_numpy(out)


def source_tensor(src_ids: Sequence[Sequence[int]], codec: TextCodec) -> torch.Tensor:
    """Encoder input [SOS] src [EOS], padded to the longest in the batch."""
    return pad_sequences(src_ids, codec.pad_id, first=codec.sos_id, last=codec.eos_id)

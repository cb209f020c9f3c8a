"""From text pairs to padded tensors: encode once, bucket by length, batch by token budget.

Masks follow one convention throughout: a boolean tensor that is True where attention is allowed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

import datasets
import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import DataLoader, Dataset

from .data import column
from .tokenizer import TextCodec

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- encoding

def encode_split(ds: datasets.Dataset, src_codec: TextCodec, tgt_codec: TextCodec) -> datasets.Dataset:
    """Add `src_ids` / `tgt_ids` columns. `datasets` caches the result next to the saved split,
    so a resumed run and every epoch reuse it instead of tokenizing again."""
    def encode(batch):
        return {"src_ids": src_codec.encode_batch(batch["src"]),
                "tgt_ids": tgt_codec.encode_batch(batch["tgt"])}
    try:
        return ds.map(encode, batched=True, batch_size=2000, desc="encoding")
    except (pa.ArrowException, OSError) as exc:
        # The cache is derived data that tmt wrote: a damaged one is rebuilt, not fatal.
        log.warning("the encoded-ids cache beside %s is damaged (%s); encoding again",
                    ds.cache_files[0]["filename"] if ds.cache_files else "the split",
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return ds.map(encode, batched=True, batch_size=2000, desc="encoding",
                      load_from_cache_file=False)


class EncodedPairs(Dataset):
    """Token ids of a split held in memory; item i is (src_ids, tgt_ids) without special tokens."""

    def __init__(self, encoded: datasets.Dataset):
        # Straight from Arrow: 10x faster than through the Dataset (1 s instead of 8 s for the
        # 345k Tatoeba pairs, at every start).
        self.src: list[list[int]] = column(encoded, "src_ids") if len(encoded) else []
        self.tgt: list[list[int]] = column(encoded, "tgt_ids") if len(encoded) else []

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, index: int) -> tuple[list[int], list[int]]:
        return self.src[index], self.tgt[index]

    def lengths(self) -> np.ndarray:
        """(N, 2): positions each example occupies in a batch, on the source side
        ([SOS] src [EOS]) and on the target side ([SOS] tgt, or tgt [EOS])."""
        src = np.fromiter((len(s) + 2 for s in self.src), dtype=np.int64, count=len(self.src))
        tgt = np.fromiter((len(t) + 1 for t in self.tgt), dtype=np.int64, count=len(self.tgt))
        return np.stack([src, tgt], axis=1)


# --------------------------------------------------------------------------- batch plan

class TokenBatchSampler:
    """Length-bucketed batches of at most `batch_tokens` padded positions, as fairseq --max-tokens.

    The plan for an epoch is a pure function of (seed, epoch), so a run can resume in the middle
    of an epoch from (epoch, batches consumed) alone. With `world_size > 1` every rank receives
    a disjoint share of the same plan, all shares of equal length (so no rank waits at the end).

    `lengths` holds the positions each example occupies: (N,), or (N, sides) for pairs
    (`EncodedPairs.lengths()`). The budget applies to the longer side; examples are ordered by
    it, then by each side's length, so that both sides of a batch pad little.
    """

    def __init__(self, lengths: np.ndarray, batch_tokens: int, seed: int, shuffle: bool = True,
                 rank: int = 0, world_size: int = 1):
        sides = np.asarray(lengths)
        self.sides = sides if sides.ndim == 2 else sides[:, None]
        self.lengths = self.sides.max(axis=1)
        self.batch_tokens = batch_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch's plan and skip its first `start` batches (resume mid-epoch)."""
        self.epoch, self.start = epoch, start

    def _all_batches(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch])
        # Sort by length, then by each side's length (on 350k Tatoeba pairs at 4096 tokens, the
        # share of real tokens rose from 0.90 to 0.99), breaking ties randomly so that batches
        # differ between epochs.
        tie_break = rng.random(len(self.lengths)) if self.shuffle else np.arange(len(self.lengths))
        order = np.lexsort((tie_break, *self.sides.T[::-1], self.lengths))
        batches, current, longest = [], [], 0
        for index in order:
            length = int(self.lengths[index])
            if current and max(longest, length) * (len(current) + 1) > self.batch_tokens:
                batches.append(np.array(current))
                current, longest = [], 0
            current.append(index)
            longest = max(longest, length)
        if current:
            batches.append(np.array(current))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches for `epoch`."""
        plan = self._all_batches(epoch)
        if not plan:
            return []
        if len(plan) < self.world_size:
            # Fewer batches than ranks: each rank takes one (some repeated) rather than some
            # ranks receiving nothing while the others wait for them in the all-reduce.
            return [plan[self.rank % len(plan)]]
        per_rank = len(plan) // self.world_size
        return plan[self.rank::self.world_size][:per_rank]

    def __len__(self) -> int:
        return len(self.batches(self.epoch))

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches(self.epoch)[self.start:]:
            yield batch.tolist()

    def padding_efficiency(self, pairs: EncodedPairs, epoch: int = 0) -> float:
        """Real tokens ÷ computed positions (source and target sides) over one epoch's plan."""
        src_len = np.array([len(s) + 2 for s in pairs.src])
        tgt_len = np.array([len(t) + 1 for t in pairs.tgt])
        real = computed = 0
        for batch in self._all_batches(epoch):
            real += src_len[batch].sum() + tgt_len[batch].sum()
            computed += len(batch) * (src_len[batch].max() + tgt_len[batch].max())
        return float(real / computed) if computed else 1.0


# --------------------------------------------------------------------------- tensors

def src_pad_mask(src: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, 1, 1, S): True for real source tokens; broadcasts over heads and query positions."""
    return (src != pad_id)[:, None, None, :]


def causal_mask(length: int, device: torch.device | None = None) -> torch.Tensor:
    """(T, T): position i may attend to positions 0..i."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def tgt_mask(tgt: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, 1, T, T): padding-and-causal mask for the decoder's self-attention."""
    return (tgt != pad_id)[:, None, None, :] & causal_mask(tgt.size(1), tgt.device)


@dataclass
class Batch:
    src: torch.Tensor        # (B, S)  [SOS] src [EOS] [PAD]...
    tgt_in: torch.Tensor     # (B, T)  [SOS] tgt [PAD]...
    tgt_out: torch.Tensor    # (B, T)  tgt [EOS] [PAD]...
    src_mask: torch.Tensor   # (B, 1, 1, S)
    tgt_mask: torch.Tensor   # (B, 1, T, T)
    n_tokens: int            # real target tokens (labels that are not padding)

    def to(self, device: torch.device) -> "Batch":
        move = {name: getattr(self, name).to(device, non_blocking=True)
                for name in ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask")}
        return Batch(**move, n_tokens=self.n_tokens)


def pad_sequences(sequences: list[list[int]], pad_id: int) -> torch.Tensor:
    longest = max(len(s) for s in sequences)
    out = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    for row, seq in enumerate(sequences):
        out[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out


def source_tensor(src_ids: list[list[int]], codec: TextCodec) -> torch.Tensor:
    """Encoder input [SOS] src [EOS], padded to the longest in the batch."""
    return pad_sequences([[codec.sos_id, *s, codec.eos_id] for s in src_ids], codec.pad_id)


class Collator:
    """Pads one batch dynamically and builds its masks once."""

    def __init__(self, src_codec: TextCodec, tgt_codec: TextCodec):
        self.src_codec, self.tgt_codec = src_codec, tgt_codec

    def __call__(self, pairs: list[tuple[list[int], list[int]]]) -> Batch:
        tgt = self.tgt_codec
        src = source_tensor([s for s, _ in pairs], self.src_codec)
        tgt_in = pad_sequences([[tgt.sos_id, *t] for _, t in pairs], tgt.pad_id)
        tgt_out = pad_sequences([[*t, tgt.eos_id] for _, t in pairs], tgt.pad_id)
        return Batch(src=src, tgt_in=tgt_in, tgt_out=tgt_out,
                     src_mask=src_pad_mask(src, self.src_codec.pad_id),
                     tgt_mask=tgt_mask(tgt_in, tgt.pad_id),
                     n_tokens=int((tgt_out != tgt.pad_id).sum()))


def make_loader(pairs: Dataset, sampler: TokenBatchSampler, collator: Collator,
                num_workers: int = 0) -> DataLoader:
    # A private generator: otherwise every new iterator draws a seed from the global torch RNG,
    # which shifts the dropout masks of everything after it (and breaks exact resume).
    return DataLoader(pairs, batch_sampler=sampler, collate_fn=collator, num_workers=num_workers,
                      generator=torch.Generator())

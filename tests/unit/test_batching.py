import numpy as np
import torch

from transformer_mt.batching import Collator, TokenBatchSampler
from transformer_mt.config import TokenizerConfig
from transformer_mt.model.masks import tgt_mask
from transformer_mt.token_store import write_token_store
from transformer_mt.tokenizer import TextCodec, train_tokenizer


def _lengths(n=1000, seed=0):
    return np.random.default_rng(seed).integers(3, 40, n)


def _pairs_of_lengths(path, src_lengths, tgt_lengths):
    """A token store whose pairs occupy these positions in a batch (ids plus special tokens)."""
    src = [[5] * (n - 2) for n in src_lengths]
    tgt = [[5] * (n - 1) for n in tgt_lengths]
    return write_token_store(path, [(src, tgt)], 10, 10)


def test_every_example_exactly_once_per_epoch():
    lengths = _lengths()
    sampler = TokenBatchSampler(lengths, 512, seed=1)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        seen = sorted(i for batch in sampler for i in batch)
        assert seen == list(range(len(lengths)))


def test_batches_respect_the_token_budget():
    lengths = _lengths()
    sampler = TokenBatchSampler(lengths, 300, seed=1)
    for batch in sampler:
        assert len(batch) * lengths[batch].max() <= 300 or len(batch) == 1


def test_same_seed_same_order_new_epoch_new_order():
    a = TokenBatchSampler(_lengths(), 512, seed=1)
    b = TokenBatchSampler(_lengths(), 512, seed=1)
    assert list(a) == list(b)
    b.set_epoch(1)
    assert list(a) != list(b)


def test_resume_mid_epoch_continues_the_same_plan():
    sampler = TokenBatchSampler(_lengths(), 512, seed=1)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.set_epoch(2, start=5)
    assert list(sampler) == full[5:]


def test_ranks_get_disjoint_equal_shares():
    lengths = _lengths(1001)
    shares = [list(TokenBatchSampler(lengths, 512, seed=1, rank=r, world_size=3))
              for r in range(3)]
    assert len({len(s) for s in shares}) == 1
    flat = [i for share in shares for batch in share for i in batch]
    assert len(flat) == len(set(flat))


def test_padding_efficiency_is_high_with_buckets(tmp_path):
    lengths = _lengths(5000)
    pairs = _pairs_of_lengths(tmp_path / "pairs", lengths, lengths)
    assert TokenBatchSampler(pairs.lengths(), 4096, seed=0).padding_efficiency(pairs) > 0.9


def test_collate_builds_shifted_targets_and_masks():
    codec = TextCodec(train_tokenizer(["a b c d"], TokenizerConfig(min_frequency=1)))
    batch = Collator(codec, codec)([([4, 5, 6], [7, 8]), ([4], [7, 8, 9, 10])])
    sos, eos, pad = codec.sos_id, codec.eos_id, codec.pad_id
    assert batch.src.tolist() == [[sos, 4, 5, 6, eos], [sos, 4, eos, pad, pad]]
    assert batch.tgt_in.tolist() == [[sos, 7, 8, pad, pad], [sos, 7, 8, 9, 10]]
    assert batch.tgt_out.tolist() == [[7, 8, eos, pad, pad], [7, 8, 9, 10, eos]]
    assert batch.n_tokens == 3 + 5
    assert batch.src_mask.shape == (2, 1, 1, 5) and batch.tgt_mask.shape == (2, 1, 5, 5)
    assert batch.src_mask[1, 0, 0].tolist() == [True, True, True, False, False]
    # row 0: position 2 sees 0..2, never the padding at 3, 4
    assert batch.tgt_mask[0, 0, 2].tolist() == [True, True, True, False, False]
    assert batch.tgt_mask[1, 0].equal(torch.ones(5, 5, dtype=torch.bool).tril())


def test_tgt_mask_hides_future_and_padding():
    tgt = torch.tensor([[2, 5, 6, 1]])
    mask = tgt_mask(tgt, pad_id=1)[0, 0]
    assert not mask.triu(1).any()
    assert not mask[:, 3].any()


def test_pairs_are_grouped_by_both_sides_lengths(tmp_path):
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(3, 30, 20000), rng.integers(3, 30, 20000)
    pairs = _pairs_of_lengths(tmp_path / "pairs", src, tgt)
    sampler = TokenBatchSampler(pairs.lengths(), 4096, seed=0)
    longer_side_only = TokenBatchSampler(pairs.lengths().max(axis=1), 4096, seed=0)
    assert pairs.lengths().tolist()[:2] == [[src[0], tgt[0]], [src[1], tgt[1]]]
    assert (sampler.padding_efficiency(pairs)
            > longer_side_only.padding_efficiency(pairs) + 0.05)
    assert sorted(i for batch in sampler for i in batch) == list(range(len(src)))
    for batch in sampler:
        assert len(batch) * np.maximum(src, tgt)[batch].max() <= 4096

"""The vectorised batch plan against the per-example loop it replaced (kept here as the
reference): the same batches in the same order, so runs started before the change resume
exactly."""

import numpy as np
import pytest
from conftest import TATOEBA

from transformer_mt import batching
from transformer_mt.batching import TokenBatchSampler


def reference_plan(sampler: TokenBatchSampler, epoch: int) -> list[np.ndarray]:
    """The former `TokenBatchSampler._all_batches`: one Python step per example."""
    rng = np.random.default_rng([sampler.seed, epoch])
    lengths, sides = sampler.lengths, sampler.sides
    tie_break = rng.random(len(lengths)) if sampler.shuffle else np.arange(len(lengths))
    order = np.lexsort((tie_break, *sides.T[::-1], lengths))
    batches, current, longest = [], [], 0
    for index in order:
        length = int(lengths[index])
        if current and max(longest, length) * (len(current) + 1) > sampler.batch_tokens:
            batches.append(np.array(current))
            current, longest = [], 0
        current.append(index)
        longest = max(longest, length)
    if current:
        batches.append(np.array(current))
    if sampler.shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def assert_same_plan(sampler: TokenBatchSampler, epochs=(0, 1)) -> None:
    for epoch in epochs:
        sampler.set_epoch(epoch)
        expected = [batch.tolist() for batch in reference_plan(sampler, epoch)]
        assert list(sampler) == expected


@pytest.mark.parametrize("batch_tokens", [1, 37, 300, 4096])
@pytest.mark.parametrize("shuffle", [True, False])
def test_plan_equals_the_per_example_loop_on_random_lengths(batch_tokens, shuffle):
    rng = np.random.default_rng(batch_tokens)
    # Pairs with independent sides, some longer than the budget, and one-sided lengths.
    pairs = rng.integers(2, 120, size=(3000, 2))
    assert_same_plan(TokenBatchSampler(pairs, batch_tokens, seed=3, shuffle=shuffle))
    assert_same_plan(TokenBatchSampler(pairs[:, 0], batch_tokens, seed=3, shuffle=shuffle))


def test_plan_is_the_same_when_coded_a_few_examples_at_a_time(monkeypatch):
    # Shape groups and random tie-breaks are made a chunk at a time (a million examples in
    # use); chunks of 7 must give the plan of one pass.
    monkeypatch.setattr(batching, "GROUP_CHUNK", 7)
    pairs = np.random.default_rng(5).integers(2, 60, size=(500, 2))
    assert_same_plan(TokenBatchSampler(pairs, 300, seed=2))


def test_plan_holds_four_bytes_an_example():
    sampler = TokenBatchSampler(np.random.default_rng(0).integers(2, 60, size=(1000, 2)), 300,
                                seed=0)
    assert {batch.dtype for batch in sampler.batches(0)} == {np.dtype(np.int32)}


def test_plan_equals_the_per_example_loop_with_lengths_past_the_table():
    # Lengths so large that the (length, sides) groups are ranked by np.unique instead.
    pairs = np.random.default_rng(0).integers(2, 400_000, size=(500, 2))
    assert_same_plan(TokenBatchSampler(pairs, 1_000_000, seed=1))


def test_plan_of_no_examples_is_empty():
    sampler = TokenBatchSampler(np.zeros((0, 2), dtype=np.int64), 100, seed=0)
    assert list(sampler) == [] and len(sampler) == 0


@pytest.fixture(scope="module")
def tatoeba_lengths() -> np.ndarray:
    """(N, 2) positions of the Tatoeba pairs, counting words (a word and its punctuation are
    one or two tokens to the tokenizer: close enough for lengths)."""
    if not TATOEBA.is_file():
        pytest.skip("../shared/data is absent")
    rows = [line.split("\t") for line in TATOEBA.read_text(encoding="utf-8").splitlines()]
    return np.array([(len(row[0].split()) + 2, len(row[1].split()) + 1)
                     for row in rows if len(row) == 2])


def test_plan_equals_the_per_example_loop_on_tatoeba(tatoeba_lengths):
    sampler = TokenBatchSampler(tatoeba_lengths, 4096, seed=0)
    sampler.set_epoch(7)
    expected = [batch.tolist() for batch in reference_plan(sampler, 7)]
    assert list(sampler) == expected
    for rank in range(2):
        share = TokenBatchSampler(tatoeba_lengths, 4096, seed=0, rank=rank, world_size=2)
        share.set_epoch(7)
        assert list(share) == expected[rank::2][:len(expected) // 2]


class LengthsOnly:
    def __init__(self, lengths: np.ndarray):
        self._lengths = lengths

    def lengths(self) -> np.ndarray:
        return self._lengths


def test_padding_efficiency_on_tatoeba_is_at_least_0_99(tatoeba_lengths):
    efficiency = TokenBatchSampler(tatoeba_lengths, 4096, seed=0).padding_efficiency(
        LengthsOnly(tatoeba_lengths))
    assert efficiency >= 0.99


def test_padding_efficiency_counts_both_sides_padding():
    # One batch of two pairs: sources 2 and 4 positions, targets 5 and 1.
    lengths = np.array([[2, 5], [4, 1]])
    sampler = TokenBatchSampler(lengths, 1000, seed=0)
    assert sampler.padding_efficiency(LengthsOnly(lengths)) == pytest.approx(12 / (2 * (4 + 5)))


def test_the_epoch_plan_is_built_once(monkeypatch):
    sampler = TokenBatchSampler(np.random.default_rng(0).integers(3, 40, 500), 256, seed=0)
    built = []
    original = sampler._build_plan
    monkeypatch.setattr(sampler, "_build_plan",
                        lambda epoch: built.append(epoch) or original(epoch))
    sampler.set_epoch(4, start=2)
    len(sampler), list(sampler), len(sampler), sampler.batches(4)
    assert built == [4]

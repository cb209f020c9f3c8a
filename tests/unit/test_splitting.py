"""The split's decisions on key arrays: bucketed sorts equal one global sort, the chunked
union-find equals a plain graph search, and memory stays a few bytes a pair."""

import tracemalloc
from collections import defaultdict

import numpy as np
import pytest

from transformer_mt import splitting
from transformer_mt.splitting import (
    DROPPED,
    assign_splits,
    connected_components,
    first_occurrences,
    sentence_graph,
)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 7 rows, so that every chunked pass crosses many chunk borders."""
    monkeypatch.setattr(splitting, "CHUNK_ROWS", 7)


def _keys(rng, n: int, distinct: int) -> np.ndarray:
    """n keys drawn from `distinct` values spread over the whole 64-bit range, the extremes
    (which land in the first and the last bucket) included."""
    values = rng.integers(0, np.iinfo(np.uint64).max, distinct, dtype=np.uint64, endpoint=True)
    values[:2] = (0, np.iinfo(np.uint64).max)
    return values[rng.integers(0, distinct, n)]


@pytest.mark.parametrize("seed", range(3))
def test_first_occurrences_equal_one_global_sort(seed, small_chunks):
    rng = np.random.default_rng(seed)
    keys = _keys(rng, 3000, 700)
    among = rng.random(3000) < 0.9
    first = first_occurrences(keys, among)
    rows = np.flatnonzero(among)
    _, index = np.unique(keys[rows], return_index=True)
    expected = np.zeros(3000, dtype=bool)
    expected[rows[index]] = True
    assert np.array_equal(first, expected)


def test_sentence_nodes_are_ranks_of_the_kept_keys(small_chunks):
    rng = np.random.default_rng(4)
    src, tgt = _keys(rng, 2000, 500), _keys(rng, 2000, 900)
    keep = rng.random(2000) < 0.8
    graph = sentence_graph(src, tgt, keep)
    src_distinct, src_rank = np.unique(src[keep], return_inverse=True)
    tgt_distinct, tgt_rank = np.unique(tgt[keep], return_inverse=True)
    assert graph.sources == len(src_distinct)
    assert graph.nodes == len(src_distinct) + len(tgt_distinct)
    assert np.array_equal(graph.src_node[keep], src_rank.reshape(-1))
    assert np.array_equal(graph.tgt_node[keep], len(src_distinct) + tgt_rank.reshape(-1))
    assert (graph.src_node[~keep] == DROPPED).all() and (graph.tgt_node[~keep] == DROPPED).all()


def _components_by_search(src: np.ndarray, tgt: np.ndarray, keep: np.ndarray) -> list[int]:
    """Component per kept row by a plain depth-first search (the reference)."""
    by_sentence = defaultdict(list)
    for row in np.flatnonzero(keep).tolist():
        by_sentence["s", int(src[row])].append(row)
        by_sentence["t", int(tgt[row])].append(row)
    label, seen = {}, 0
    for start in np.flatnonzero(keep).tolist():
        if start in label:
            continue
        stack = [start]
        label[start] = seen
        while stack:
            row = stack.pop()
            for other in by_sentence["s", int(src[row])] + by_sentence["t", int(tgt[row])]:
                if other not in label:
                    label[other] = seen
                    stack.append(other)
        seen += 1
    return [label[row] for row in np.flatnonzero(keep).tolist()]


def _same_partition(a: list[int], b: list[int]) -> bool:
    return len(set(zip(a, b))) == len(set(a)) == len(set(b))


@pytest.mark.parametrize("seed", range(4))
def test_components_equal_a_graph_search(seed, small_chunks):
    rng = np.random.default_rng(seed)
    n = 1500
    src, tgt = _keys(rng, n, 600 + 200 * seed), _keys(rng, n, 500 + 300 * seed)
    keep = rng.random(n) < 0.85
    component, sources = connected_components(sentence_graph(src, tgt, keep))
    assert (component[~keep] == DROPPED).all()
    assert _same_partition(component[keep].tolist(), _components_by_search(src, tgt, keep))
    # Numbered 0..C-1, each with its count of distinct source sentences.
    assert set(component[keep].tolist()) == set(range(len(sources)))
    for c in range(len(sources)):
        assert sources[c] == len(set(src[keep][component[keep] == c].tolist()))


def test_a_long_chain_is_one_component(small_chunks):
    # s0-t0, s1-t0, s1-t1, s2-t1, ...: every pair reaches every other only through the chain,
    # numbered so that hooking must climb it (the worst case for the union-find's passes).
    n = 400
    src = np.repeat(np.arange(n, dtype=np.uint64), 2)[1:]
    tgt = np.repeat(np.arange(n, dtype=np.uint64)[::-1] + np.uint64(10**6), 2)[:-1]
    component, sources = connected_components(sentence_graph(src, tgt))
    assert set(component.tolist()) == {0} and sources.tolist() == [n]


def test_dropped_rows_join_nothing():
    src = np.array([1, 2, 2], dtype=np.uint64)
    tgt = np.array([10, 10, 20], dtype=np.uint64)
    component, _ = connected_components(sentence_graph(src, tgt, np.array([True, False, True])))
    assert component.tolist() == [0, DROPPED, 1]


def test_split_codes_of_dropped_rows_and_no_sentence_in_two_splits(small_chunks):
    rng = np.random.default_rng(7)
    n = 4000
    src, tgt = _keys(rng, n, 2500), _keys(rng, n, 3000)
    keep = rng.random(n) < 0.9
    codes = assign_splits(sentence_graph(src, tgt, keep), 100, 150, seed=1)
    assert (codes[~keep] == DROPPED).all() and set(codes[keep].tolist()) == {0, 1, 2}
    for keys in (src, tgt):
        owners = defaultdict(set)
        for key, code in zip(keys[keep].tolist(), codes[keep].tolist()):
            owners[key].add(code)
        assert all(len(split) == 1 for split in owners.values())
    for code, wanted in ((1, 100), (2, 150)):
        assert len(set(src[codes == code].tolist())) >= wanted


def test_splitting_holds_a_few_bytes_a_pair(monkeypatch):
    """Deduplication, the sentence graph and the split of 2 M pairs, measured by tracemalloc
    (numpy reports its arrays to it): besides the arrays the caller holds, at most 16 bytes a
    pair at any moment. Sorting whole key arrays (np.unique on 2 M keys) takes over 40."""
    monkeypatch.setattr(splitting, "CHUNK_ROWS", 1 << 16)
    n = 2_000_000
    rng = np.random.default_rng(0)
    src = rng.integers(0, n // 2, n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    tgt = rng.integers(0, n, n, dtype=np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
    tracemalloc.start()
    try:
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        keep = first_occurrences(src ^ tgt)
        graph = sentence_graph(src, tgt, keep)
        peak_graph = tracemalloc.get_traced_memory()[1] - held
        del src, tgt
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        assign_splits(graph, 1000, 2000, seed=1)
        peak_split = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()
    # The graph itself is 8 bytes a pair and the mask 1; the rest is passing.
    assert peak_graph / n <= 8 + 1 + 16 + 8, peak_graph / n   # + the XOR'd keys (8)
    assert peak_split / n <= 16, peak_split / n

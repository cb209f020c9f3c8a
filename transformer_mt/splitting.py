"""Which pairs are kept and which split each goes to, decided on 64-bit keys in bounded memory.

Cleaning (corpus.py) gives every corpus row three keys: of its normalised pair, of its source and
of its target sentence (BLAKE2b, so they are the same in every process). From those alone:

- `first_occurrences`: of the pairs with equal keys (exact duplicates), the first;
- `sentence_graph`: sentences numbered as nodes (sources 0..S-1, targets S..S+T-1, in the
  sorted order of their keys), a kept pair being an edge between its two sentences;
- `connected_components`: pairs joined through a shared source or target sentence;
- `assign_splits`: whole components dealt out, seeded, to valid, test and train.

Memory per corpus row is what the arrays hold, not what sorting them would take: the sort-based
steps run bucket by bucket over the top bits of the keys (a key's bucket is its top 6 bits, so
buckets in order are keys in sorted order and the results equal one global sort; the keys are
hashes, so the buckets are even), and the
union-find passes over the pairs in chunks. With the keys gone, the graph is 8 bytes a row plus
at most 8 bytes a sentence, so a corpus of 10 M pairs is split in well under 400 MB.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .errors import TmtError

log = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "valid", "test")        # split codes 0, 1, 2 of `assign_splits`
DROPPED = -1                                    # node, component or split code of a row not kept
BUCKET_BITS = 6                                 # 64 buckets: each sort holds 1/64 of the keys
CHUNK_ROWS = 1 << 20                            # rows per chunk of the union-find passes


def _chunks(length: int) -> Iterator[slice]:
    return (slice(start, start + CHUNK_ROWS) for start in range(0, length, CHUNK_ROWS))


def _buckets(keys: np.ndarray, keep: np.ndarray | None) -> Iterator[np.ndarray]:
    """Row numbers (ascending) of the kept rows, bucket by bucket in ascending key order."""
    shift = np.uint64(64 - BUCKET_BITS)
    bucket = np.empty(len(keys), dtype=np.uint8)          # 1 byte a row, not a sorted copy
    for part in _chunks(len(keys)):
        bucket[part] = keys[part] >> shift
        if keep is not None:
            bucket[part][~keep[part]] = 1 << BUCKET_BITS      # a bucket never visited
    for b in range(1 << BUCKET_BITS):
        yield np.flatnonzero(bucket == b)


def first_occurrences(keys: np.ndarray, among: np.ndarray | None = None) -> np.ndarray:
    """Mask of the rows (of those in `among`, or all) whose key no earlier such row has."""
    first = np.zeros(len(keys), dtype=bool)
    for rows in _buckets(keys, among):
        # np.unique sorts stably when asked for indices: the first index is the first row.
        _, index = np.unique(keys[rows], return_index=True)
        first[rows[index]] = True
    return first


def _node_numbers(keys: np.ndarray, keep: np.ndarray | None, first: int) -> tuple[np.ndarray, int]:
    """Per row: `first` + the rank of its key among the distinct keys of the kept rows (int32,
    DROPPED where not kept); and how many distinct keys there are."""
    nodes = np.full(len(keys), DROPPED, dtype=np.int32)
    count = first
    for rows in _buckets(keys, keep):
        distinct, inverse = np.unique(keys[rows], return_inverse=True)
        nodes[rows] = count + inverse.reshape(-1)
        count += len(distinct)
    if count > np.iinfo(np.int32).max:
        raise TmtError(f"the corpus has {count} distinct sentences; splitting supports at most "
                       f"{np.iinfo(np.int32).max}")
    return nodes, count - first


@dataclass
class SentenceGraph:
    """Sentences as nodes, pairs as edges: row i joins src_node[i] and tgt_node[i] (both
    DROPPED for a row not kept)."""
    src_node: np.ndarray      # int32 per row: 0 .. sources-1
    tgt_node: np.ndarray      # int32 per row: sources .. nodes-1
    sources: int              # distinct source sentences
    nodes: int                # distinct source plus distinct target sentences

    @property
    def kept(self) -> np.ndarray:
        return self.src_node != DROPPED


def sentence_graph(src_keys: np.ndarray, tgt_keys: np.ndarray,
                   keep: np.ndarray | None = None) -> SentenceGraph:
    """The graph of the rows in `keep` (all when None). The same string in both languages is two
    nodes: only sentences of one language are joined."""
    src_node, sources = _node_numbers(src_keys, keep, 0)
    tgt_node, targets = _node_numbers(tgt_keys, keep, sources)
    return SentenceGraph(src_node, tgt_node, sources, sources + targets)


def _edges(graph: SentenceGraph) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for part in _chunks(len(graph.src_node)):
        a, b = graph.src_node[part], graph.tgt_node[part]
        kept = a != DROPPED
        yield a[kept], b[kept]


def _compress(parent: np.ndarray) -> None:
    """Point every node at its root, in place, a chunk at a time (pointer jumping: a node's
    new parent is always one of its ancestors, so updating in place is safe)."""
    while True:
        changed = False
        for part in _chunks(len(parent)):
            here = parent[part]
            grandparent = parent[here]
            if not np.array_equal(grandparent, here):
                here[:] = grandparent
                changed = True
        if not changed:
            return


def _roots(graph: SentenceGraph) -> np.ndarray:
    """Per node, the smallest node of its component.

    Union-find on arrays: each pass over the edges hooks the larger root of every edge whose
    ends have different roots under the smaller one, then compresses paths fully. parent[x] <= x
    always holds and x's parent is always in x's component, so no cycle forms and no two
    components merge; a pass that finds no edge apart leaves every component one tree whose
    root is its smallest node. A few dozen passes suffice even for long chains."""
    parent = np.arange(graph.nodes, dtype=np.int32)
    while True:
        hooked = False
        for a, b in _edges(graph):
            root_a, root_b = parent[a], parent[b]
            apart = root_a != root_b
            if apart.any():
                # Within a pass a root hooked earlier may no longer be a root; hooking it again
                # can drop a link, which a later pass restores: only a pass with nothing apart
                # (on a compressed forest) ends the loop.
                np.minimum.at(parent, np.maximum(root_a[apart], root_b[apart]),
                              np.minimum(root_a[apart], root_b[apart]))
                hooked = True
        _compress(parent)
        if not hooked:
            return parent


def connected_components(graph: SentenceGraph) -> tuple[np.ndarray, np.ndarray]:
    """Component number per row (int32, 0..C-1 in the order of each component's smallest
    sentence; DROPPED for rows not kept) and the number of distinct source sentences of each
    component (C)."""
    roots = _roots(graph)
    # Components are numbered in the order of their roots: a root's number is how many roots
    # precede it. Computed in chunks and in place, so that nodes cost 8 bytes each at most.
    rank = np.empty(graph.nodes, dtype=np.int32)
    for part in _chunks(graph.nodes):
        rank[part] = roots[part] == np.arange(part.start, part.start + len(roots[part]))
    np.cumsum(rank, out=rank)
    rank -= 1
    for part in _chunks(graph.nodes):
        roots[part] = rank[roots[part]]           # now the component number of every node
    del rank
    count = int(roots.max()) + 1 if graph.nodes else 0
    component = np.full(len(graph.src_node), DROPPED, dtype=np.int32)
    for part in _chunks(len(component)):
        nodes = graph.src_node[part]
        component[part][nodes != DROPPED] = roots[nodes[nodes != DROPPED]]
    sources_per_component = np.bincount(roots[:graph.sources], minlength=count).astype(np.int32)
    return component, sources_per_component


def _largest(component: np.ndarray, count: int) -> int:
    sizes = np.zeros(count, dtype=np.int64)
    for part in _chunks(len(component)):
        here = component[part]
        sizes += np.bincount(here[here != DROPPED], minlength=count)
    return int(sizes.max()) if count else 0


def assign_splits(graph: SentenceGraph, valid_size: int, test_size: int,
                  seed: int) -> np.ndarray:
    """Split code per row (0 train, 1 valid, 2 test, DROPPED for rows not kept) such that no
    source and no target sentence is in two splits.

    Whole connected components are dealt out in a seeded random order: to valid until it holds
    at least `valid_size` distinct source sentences, then to test until it holds `test_size`,
    the rest to train. Sizes count distinct source sentences (the sentences `tmt evaluate`
    translates); a split overshoots by less than one component."""
    component, sources_per_component = connected_components(graph)
    count = len(sources_per_component)
    total = graph.sources
    if total <= valid_size + test_size:
        raise TmtError(f"the corpus has {total} distinct source sentences after cleaning, "
                       f"not enough for data.valid_size={valid_size} + data.test_size="
                       f"{test_size} and a training set; lower them or use more data")
    # Only the head of the seeded order goes to valid and test (each component holds a source
    # sentence, so valid_size + test_size + 1 components always reach both sizes).
    head = np.random.default_rng(seed).permutation(count)[:valid_size + test_size + 1].copy()
    filled = np.cumsum(sources_per_component[head], dtype=np.int64)
    del sources_per_component
    # Components before the one that reaches the size, and that one too.
    valid_end = int(np.searchsorted(filled, valid_size)) + 1
    test_end = valid_end + (int(np.searchsorted(filled[valid_end:] - filled[valid_end - 1],
                                                test_size)) + 1 if test_size else 0)
    if test_end >= count:
        raise TmtError(f"data.valid_size={valid_size} and data.test_size={test_size} take all "
                       f"{count} groups of connected sentence pairs (pairs that share a source "
                       f"or target sentence); lower them or use more data")
    split_of_component = np.zeros(count + 1, dtype=np.int8)    # the last: DROPPED rows
    split_of_component[head[:valid_end]] = 1
    split_of_component[head[valid_end:test_end]] = 2
    split_of_component[count] = DROPPED
    splits = split_of_component[component]      # component DROPPED (-1) reads the last entry
    log.info("split: %d groups of pairs connected by a shared source or target sentence, the "
             "largest of %d pairs; %s", count, _largest(component, count),
             ", ".join(f"{name} {int((splits == code).sum())} pairs in "
                       f"{int((split_of_component[:count] == code).sum())} groups"
                       for code, name in enumerate(SPLIT_NAMES)))
    return splits

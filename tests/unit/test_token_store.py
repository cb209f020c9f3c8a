import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_mt import token_store
from transformer_mt.batching import Collator, TokenBatchSampler, make_loader
from transformer_mt.config import TokenizerConfig
from transformer_mt.errors import TmtError
from transformer_mt.token_store import TokenStore, write_token_store
from transformer_mt.tokenizer import TextCodec, train_tokenizer


def random_pairs(n: int, vocab_size: int, seed: int = 0,
                 lowest: int = 0) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    # Some empty sentences, and ids up to the top of the vocabulary.
    return [(rng.integers(lowest, vocab_size, rng.integers(0, 30)).tolist(),
             rng.integers(lowest, vocab_size, rng.integers(0, 30)).tolist()) for _ in range(n)]


def in_batches(pairs, size):
    for start in range(0, len(pairs), size):
        chunk = pairs[start:start + size]
        yield [s for s, _ in chunk], [t for _, t in chunk]


@pytest.mark.parametrize("vocab_size, dtype", [(65536, np.uint16), (70000, np.int32)])
def test_ids_read_back_equal_those_written(tmp_path, vocab_size, dtype):
    pairs = random_pairs(500, vocab_size)
    pairs[7] = ([vocab_size - 1, 0], [vocab_size - 1])
    store = write_token_store(tmp_path / "train", in_batches(pairs, 64), vocab_size, vocab_size)
    assert len(store) == len(pairs)
    for index, (src, tgt) in enumerate(pairs):
        read_src, read_tgt = store[index]
        assert read_src.dtype == dtype and read_src.tolist() == src and read_tgt.tolist() == tgt
    assert (tmp_path / "train" / "src.ids").stat().st_size == \
        sum(len(s) for s, _ in pairs) * np.dtype(dtype).itemsize


@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_lengths_come_from_the_offsets(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(token_store, "OFFSETS_CHUNK", chunk)     # read a few offsets at a time
    pairs = random_pairs(300, 1000)
    store = write_token_store(tmp_path / "s", in_batches(pairs, 50), 1000, 1000)
    expected = [[len(s) + 2, len(t) + 1] for s, t in pairs]
    # Opened, then its id files gone: lengths do not need them.
    (tmp_path / "s" / "src.ids").unlink()
    (tmp_path / "s" / "tgt.ids").unlink()
    assert store.lengths().tolist() == expected
    assert store.lengths().dtype == np.int16          # 4 bytes a pair


def test_lengths_past_int16_are_kept_whole(tmp_path):
    pairs = [([1] * 40_000, [2]), ([3], [4] * 5)]
    store = write_token_store(tmp_path / "s", [pairs], 10, 10)
    assert store.lengths().tolist() == [[40_002, 2], [3, 6]]


def test_an_empty_store_opens(tmp_path):
    store = write_token_store(tmp_path / "empty", iter([]), 10, 10)
    assert len(store) == 0 and store.lengths().shape == (0, 2)


def test_an_interrupted_write_leaves_no_store(tmp_path):
    def failing_batches():
        yield from in_batches(random_pairs(100, 50), 10)
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        write_token_store(tmp_path / "train", failing_batches(), 50, 50)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TmtError, match="no token store"):
        TokenStore(tmp_path / "train")


def test_a_killed_write_is_never_read_as_complete(tmp_path, monkeypatch):
    # A process killed before the rename leaves only its .partial folder behind.
    monkeypatch.setattr("transformer_mt.token_store.shutil.rmtree", lambda *a, **k: None)
    monkeypatch.setattr("transformer_mt.token_store.os.rename",
                        lambda *a: (_ for _ in ()).throw(SystemExit))
    with pytest.raises(SystemExit):
        write_token_store(tmp_path / "train", in_batches(random_pairs(100, 50), 10), 50, 50)
    (leftover,) = tmp_path.iterdir()
    assert leftover.name.endswith(".partial")
    with pytest.raises(TmtError, match="no token store"):
        TokenStore(tmp_path / "train")


def test_a_truncated_file_is_refused(tmp_path):
    write_token_store(tmp_path / "train", in_batches(random_pairs(100, 50), 10), 50, 50)
    ids = tmp_path / "train" / "tgt.ids"
    ids.write_bytes(ids.read_bytes()[:-2])
    with pytest.raises(TmtError, match="damaged: tgt.ids"):
        TokenStore(tmp_path / "train")


def test_an_existing_store_is_never_overwritten(tmp_path):
    write_token_store(tmp_path / "train", in_batches(random_pairs(10, 50), 5), 50, 50)
    before = (tmp_path / "train" / "src.ids").read_bytes()
    with pytest.raises(TmtError, match="already exists"):
        write_token_store(tmp_path / "train", in_batches(random_pairs(20, 50, 1), 5), 50, 50)
    assert (tmp_path / "train" / "src.ids").read_bytes() == before


def test_ids_outside_the_vocabulary_are_refused(tmp_path):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        write_token_store(tmp_path / "train", [([[3, 70000]], [[1]])], 70000, 10)


def test_pickles_without_the_ids(tmp_path):
    pairs = random_pairs(20000, 1000)
    store = write_token_store(tmp_path / "train", in_batches(pairs, 1000), 1000, 1000)
    store[0]                                  # maps the files in this process
    copy = pickle.loads(pickle.dumps(store))
    assert len(pickle.dumps(store)) < 1000
    assert copy[19999][1].tolist() == pairs[19999][1]


def codec() -> TextCodec:
    words = " ".join(f"w{i}" for i in range(40))
    return TextCodec(train_tokenizer([words], TokenizerConfig(min_frequency=1)))


def reference_collate(pairs, codec):
    """The Collator's padding before it was vectorised: one Python list per row."""
    def pad(rows):
        out = torch.full((len(rows), max(map(len, rows))), codec.pad_id, dtype=torch.long)
        for row, ids in enumerate(rows):
            out[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out
    return (pad([[codec.sos_id, *s, codec.eos_id] for s, _ in pairs]),
            pad([[codec.sos_id, *t] for _, t in pairs]),
            pad([[*t, codec.eos_id] for _, t in pairs]))


def test_collator_gives_the_same_tensors_from_lists_and_from_the_store(tmp_path):
    text_codec = codec()
    special = max(text_codec.pad_id, text_codec.sos_id, text_codec.eos_id)
    pairs = random_pairs(64, text_codec.vocab_size, seed=3, lowest=special + 1)
    store = write_token_store(tmp_path / "train", in_batches(pairs, 16), text_codec.vocab_size,
                              text_codec.vocab_size)
    collate = Collator(text_codec, text_codec)
    src, tgt_in, tgt_out = reference_collate(pairs, text_codec)
    for batch in (collate(pairs), collate([store[i] for i in range(len(store))])):
        assert batch.src.dtype == torch.long
        assert batch.src.equal(src) and batch.tgt_in.equal(tgt_in) and batch.tgt_out.equal(tgt_out)
        assert batch.n_tokens == sum(len(t) + 1 for _, t in pairs)


def test_worker_processes_read_the_same_batches(tmp_path):
    text_codec = codec()
    special = max(text_codec.pad_id, text_codec.sos_id, text_codec.eos_id)
    pairs = random_pairs(400, text_codec.vocab_size, seed=5, lowest=special + 1)
    store = write_token_store(tmp_path / "train", in_batches(pairs, 100), text_codec.vocab_size,
                              text_codec.vocab_size)
    sampler = TokenBatchSampler(store.lengths(), 256, seed=0)
    collate = Collator(text_codec, text_codec)
    in_process = list(make_loader(store, sampler, collate, num_workers=0))
    in_workers = list(make_loader(store, sampler, collate, num_workers=2))
    assert len(in_process) == len(in_workers) > 1
    for a, b in zip(in_process, in_workers):
        assert a.src.equal(b.src) and a.tgt_out.equal(b.tgt_out)
    expected = [pairs[i][1] for i in next(iter(sampler))]
    assert [row[row != text_codec.pad_id][:-1].tolist() for row in in_process[0].tgt_out] \
        == expected


@pytest.mark.parametrize("header", ['[1]', '{"format": 1}', '{"format": 1, "pairs": 3, '
                                    '"src": {"dtype": "nonsense", "tokens": 0}}'])
def test_a_damaged_header_is_refused(tmp_path, header):
    write_token_store(tmp_path / "train", in_batches(random_pairs(10, 50), 5), 50, 50)
    (tmp_path / "train" / "header.json").write_text(header)
    with pytest.raises(TmtError, match="token store"):
        TokenStore(tmp_path / "train")


def _resident_file_kb() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssFile:"))


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux's /proc")
def test_reading_examples_does_not_make_the_store_resident(tmp_path):
    # 400k pairs, ~24 MB of ids a side, all in the page cache (just written). Mapped, 3,000
    # random examples made most of the files resident in this process (the kernel maps
    # page-cache folios of up to megabytes a fault); read, none of it stays.
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 50, size=400_000)
    store = write_token_store(tmp_path / "big", (
        ([rng.integers(4, 8000, n) for n in chunk],) * 2
        for chunk in np.array_split(lengths, 40)), 8000, 8000)
    store[0]
    before = _resident_file_kb()
    for index in rng.integers(0, len(store), 3000):
        src, tgt = store[int(index)]
        assert len(src) == lengths[index] and src.min() >= 4 and tgt.max() < 8000  # reads them
    assert _resident_file_kb() - before < 4 * 1024


def test_a_store_truncated_while_read_gives_an_error_not_a_crash(tmp_path):
    pairs = random_pairs(100, 50, seed=2)
    store = write_token_store(tmp_path / "train", in_batches(pairs, 10), 50, 50)
    store[0]                                    # opened before the damage
    with open(tmp_path / "train" / "tgt.ids", "r+b") as handle:
        handle.truncate(0)
    last_with_target = max(i for i, (_, t) in enumerate(pairs) if t)
    with pytest.raises(TmtError, match="damaged"):        # mapped, reading it was a SIGBUS
        store[last_with_target][1].tolist()

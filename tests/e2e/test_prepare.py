"""A run's data path end to end (pipeline.py over corpus.py): corpus -> split -> tokenizers -> token ids."""

import itertools
import logging
import random
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, needs_real_text, sample_pairs

from transformer_mt.arrow_io import column
from transformer_mt.config import config_from_dict
from transformer_mt.corpus import clean_pairs
from transformer_mt.names import copy_augmented
from transformer_mt.pipeline import load_data, prepare_data
from transformer_mt.rundir import RunDir

# The summary line scripts/bench_data.py reads from train.log.
sys.path.insert(0, str(ROOT / "scripts"))
from bench_data import STAGE_LINE  # noqa: E402

LONG = "word " * 50


def _corpus(path: Path) -> Path:
    """Real pairs, with what cleaning must deal with: exact duplicates, duplicates that differ
    only in white space, an empty side, a pair too long, two lines that are not pairs."""
    pairs = sample_pairs(600, seed=5)
    lines = ([f"{s}\t{t}" for s, t in pairs] + [f"{s}\t{t}" for s, t in pairs[:40]]
             + [f" {s}  \t{t}" for s, t in pairs[40:50]]
             + ["no tab here", "a\tb\tc", " \tvuoto", f"{LONG}\tparola"])
    random.Random(0).shuffle(lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _config(corpus: Path, **tokenizer):
    return config_from_dict({"data": {"source": "tsv", "path": str(corpus), "valid_size": 30,
                                      "test_size": 30, "max_len": 20},
                             "tokenizer": {"min_frequency": 1, **tokenizer}})


def _prepared(tmp_path: Path, name: str, cfg) -> RunDir:
    run = RunDir(tmp_path / name)
    run.path.mkdir()
    prepare_data(cfg, run)
    return run


def _files(run: RunDir) -> dict[str, bytes]:
    return {str(path.relative_to(run.path)): path.read_bytes()
            for folder in (run.data, run.tokenizers) for path in sorted(folder.rglob("*"))
            if path.is_file()}


def test_prepared_splits_are_disjoint_cleaned_and_reproducible(tmp_path, caplog):
    corpus = _corpus(tmp_path / "c.tsv")
    cfg = _config(corpus)
    run = _prepared(tmp_path, "a", cfg)
    data = load_data(run)
    splits = {name: list(zip(column(ds, "src"), column(ds, "tgt")))
              for name, ds in data.splits.items()}
    for side in (0, 1):            # no English and no Italian sentence in two splits
        for a, b in itertools.combinations(splits.values(), 2):
            assert not {p[side] for p in a} & {p[side] for p in b}
    kept = [pair for pairs in splits.values() for pair in pairs]
    fields = [line.split("\t") for line in corpus.read_text().splitlines()]
    good = [f for f in fields if len(f) == 2]
    assert sorted(kept) == sorted(zip(*clean_pairs([f[0] for f in good], [f[1] for f in good],
                                                   cfg.data)))
    assert len(kept) == len(set(kept)) and not any(s.startswith("word word") for s, _ in kept)
    assert "skipped 2 of" in caplog.text
    assert _files(_prepared(tmp_path, "b", cfg)) == _files(run)       # same bytes, same seed


def test_token_stores_hold_the_tokenizers_encodings(tmp_path):
    data = load_data(_prepared(tmp_path, "run", _config(_corpus(tmp_path / "c.tsv"))))
    for name in ("train", "valid"):
        split, store = getattr(data.splits, name), getattr(data, name)
        src = data.src_codec.encode_batch(column(split, "src"))
        tgt = data.tgt_codec.encode_batch(column(split, "tgt"))
        assert len(store) == len(split) == len(src)
        assert all(store[i][0].tolist() == src[i] and store[i][1].tolist() == tgt[i]
                   for i in range(len(store)))
        assert store.header["src"]["dtype"] == "uint16"


def test_a_missing_store_is_rebuilt_from_the_saved_split_not_the_corpus(tmp_path):
    corpus = _corpus(tmp_path / "c.tsv")
    run = _prepared(tmp_path, "run", _config(corpus))
    before = _files(run)
    for path in (run.ids / "train").iterdir():
        path.unlink()
    (run.ids / "train").rmdir()
    corpus.unlink()
    load_data(run)
    assert _files(run) == before


def test_copy_augmentation_adds_its_pairs_to_the_train_store_only(tmp_path):
    corpus = _corpus(tmp_path / "c.tsv")
    raw = {"data": {"source": "tsv", "path": str(corpus), "valid_size": 30, "test_size": 30,
                    "max_len": 20, "copy_augment": 1.0}, "tokenizer": {"min_frequency": 1}}
    cfg = config_from_dict(raw)
    run = _prepared(tmp_path, "run", cfg)
    data = load_data(run, cfg.data)
    plain = load_data(_prepared(tmp_path, "plain", config_from_dict(
        {**raw, "data": {**raw["data"], "copy_augment": 0.0}})))
    srcs, tgts = column(data.splits.train, "src"), column(data.splits.train, "tgt")
    assert srcs == column(plain.splits.train, "src")          # the saved split is the same
    extra_srcs, extra_tgts = copy_augmented(srcs, tgts, 1.0, cfg.data.seed, 0)
    assert extra_srcs and len(data.train) == len(srcs) + len(extra_srcs)
    for i, (src, tgt) in enumerate(zip(srcs + extra_srcs, tgts + extra_tgts)):
        assert data.train[i][0].tolist() == data.src_codec.encode(src)
        assert data.train[i][1].tolist() == data.tgt_codec.encode(tgt)
    assert len(data.valid) == len(data.splits.valid)
    # A deleted store is rebuilt with the same extra pairs.
    before = _files(run)
    shutil.rmtree(run.ids / "train")
    load_data(run, cfg.data)
    assert _files(run) == before


@needs_real_text
def test_every_stage_logs_its_time_and_a_sample_trains_the_tokenizers(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    corpus = _corpus(tmp_path / "c.tsv")
    full = load_data(_prepared(tmp_path, "full", _config(corpus)))
    stages = {m["name"] for m in STAGE_LINE.finditer(caplog.text) if m["peak_mb"]}
    assert stages >= {"reading", "cleaning", "splitting", "tokenizer training", "encoding train",
                      "encoding valid"}
    sampled = [load_data(_prepared(tmp_path, name, _config(corpus, sample_pairs=50)))
               for name in ("s1", "s2")]
    assert sampled[0].src_codec.to_str() == sampled[1].src_codec.to_str()    # seeded
    assert sampled[0].src_codec.vocab_size < full.src_codec.vocab_size / 2
    assert len(sampled[0].train) == len(full.train)      # only the tokenizers see a sample


# Peak RSS of preparation (split, tokenizers, ids) above what the process holds after its imports,
# on the 200k pairs below: 264 MB when every stage held the corpus in Python lists (tmt before
# issue 14), 70 MB streamed; 1.15 GB a million pairs and growing in the old design.
PREPARE_RSS_BOUND_MB = 150
MEASURE = """
import resource, sys
from pathlib import Path
from transformer_mt.config import config_from_dict
from transformer_mt.pipeline import load_data, prepare_data
from transformer_mt.rundir import RunDir
imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cfg = config_from_dict({"data": {"source": "tsv", "path": sys.argv[1], "valid_size": 100,
                                 "test_size": 100}, "tokenizer": {"min_frequency": 1}})
run = RunDir(Path(sys.argv[2]))
run.path.mkdir()
prepare_data(cfg, run)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - imported) // 1024

def file_pages_mb():        # pages of files mapped into this process (RssFile)
    status = dict(line.split(":") for line in open("/proc/self/status") if ":" in line)
    return int(status["RssFile"].split()[0]) / 1024

before = file_pages_mb()
data = load_data(run)
opened = file_pages_mb() - before
import datasets             # the control: a memory-mapped Dataset of the same file
before = file_pages_mb()
mapped_split = datasets.load_from_disk(str(run.data / "train"))
mapped = file_pages_mb() - before
size = sum(f.stat().st_size for f in (run.data / "train").glob("*.arrow")) / 2**20
print(len(data.train), grown, opened, mapped, size)
"""


@needs_real_text
def test_preparation_memory_does_not_grow_with_the_corpus(tmp_path):
    pairs, rng = sample_pairs(600), random.Random(0)
    corpus = tmp_path / "big.tsv"
    with open(corpus, "w", encoding="utf-8") as out:
        for _ in range(200_000):           # two pairs joined: ~150k distinct, longer sentences
            (a, b), (c, d) = rng.choice(pairs), rng.choice(pairs)
            out.write(f"{a} {c}\t{b} {d}\n")
    result = subprocess.run([sys.executable, "-c", MEASURE, str(corpus), str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr
    train_pairs, grown_mb, opened_mb, mapped_mb, size_mb = map(float, result.stdout.split())
    assert train_pairs > 100_000
    assert grown_mb < PREPARE_RSS_BOUND_MB, f"preparation grew RSS by {grown_mb} MB"
    # Opening the run for training leaves the train split's text on disk (a 10 M-pair run held
    # a 1 GB split in memory when it was opened as a memory-mapped Dataset): the control shows
    # that the measure sees a mapped file.
    assert mapped_mb > 0.5 * size_mb, (mapped_mb, size_mb)
    assert opened_mb < 0.2 * size_mb, f"opening the run mapped {opened_mb:.1f} MB of {size_mb:.1f}"

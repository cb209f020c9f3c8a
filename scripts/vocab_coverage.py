"""Out-of-vocabulary rates of word-level vocabularies, per size cap and frequency threshold.

No training: the corpus of a config is cleaned and split exactly as `tmt train` does, word-level
vocabularies are learnt from the train split (as tokenizer.max_vocab / tokenizer.min_frequency
would make them), and the script counts, for each side, the share of tokens and of sentences
that would be [UNK] in the test split and in the unseen-words sets built from it
(transformer_mt/unseen.py), and optionally in extra plain-text files.

    python scripts/vocab_coverage.py --config configs/tatoeba_en_it_word.yaml \
        --caps 8000 12000 16000 24000 32000 0 --min-frequency 1 2 3 \
        --extra-src ../shared/data/newstest2009-en-it/newstest2009.en \
        --extra-tgt ../shared/data/newstest2009-en-it/newstest2009.it [--json]

A cap of 0 means no cap (every word seen at least min_frequency times).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformer_mt.arrow_io import column  # noqa: E402
from transformer_mt.config import TokenizerConfig, load_config  # noqa: E402
from transformer_mt.corpus import prepare_splits  # noqa: E402
from transformer_mt.tokenizer import TextCodec, train_tokenizer  # noqa: E402
from transformer_mt.unseen import name_swap_set, rare_word_set  # noqa: E402


def _read(path: str | None) -> list[str] | None:
    return Path(path).read_text(encoding="utf-8").splitlines() if path else None


def coverage(train: list[str], sets: dict[str, list[str]], caps: list[int],
             min_frequency: int) -> list[dict]:
    """One row per cap: vocabulary size and, per set, the share of unknown tokens and of
    sentences with one. The uncapped vocabulary gives ids in order of falling frequency, so a
    cap of N keeps exactly the ids below N (as the trainer with vocab_size N would)."""
    codec = TextCodec(train_tokenizer(train, TokenizerConfig(min_frequency=min_frequency)))
    encoded = {name: [np.array(ids, dtype=np.int64) for ids in codec.encode_batch(sentences)]
               for name, sentences in sets.items()}
    rows = []
    for cap in caps:
        size = codec.vocab_size if cap == 0 else min(cap, codec.vocab_size)
        row = {"cap": cap, "min_frequency": min_frequency, "vocabulary": size}
        for name, sentences in encoded.items():
            unknown = [(ids >= size) | (ids == codec.unk_id) for ids in sentences]
            tokens = sum(len(u) for u in unknown)
            row[name] = {"tokens": round(sum(int(u.sum()) for u in unknown) / max(tokens, 1), 4),
                         "sentences": round(sum(bool(u.any()) for u in unknown)
                                            / max(len(unknown), 1), 4)}
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tatoeba_en_it_word.yaml")
    parser.add_argument("--caps", type=int, nargs="+", default=[8000, 12000, 16000, 24000, 0])
    parser.add_argument("--min-frequency", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--extra-src", help="plain text, one source sentence per line")
    parser.add_argument("--extra-tgt", help="its line-aligned references")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    cfg = load_config(args.config)
    scratch = tempfile.TemporaryDirectory(prefix="vocab_coverage.")
    splits = prepare_splits(cfg.data, Path(scratch.name) / "data")
    held_out = {"test": (column(splits.test, "src"), column(splits.test, "tgt"))}
    for unseen in (rare_word_set(splits.train, splits.test),
                   name_swap_set(splits.train, splits.test)):
        held_out[unseen.name] = (unseen.sources, unseen.references)
    if args.extra_src:
        held_out[Path(args.extra_src).stem] = (_read(args.extra_src), _read(args.extra_tgt) or [])
    results = {}
    for index, side in enumerate(("src", "tgt")):
        sets = {name: pair[index] for name, pair in held_out.items() if pair[index]}
        results[side] = [row for m in args.min_frequency
                         for row in coverage(column(splits.train, side), sets, args.caps, m)]
    if args.json:
        print(json.dumps(results))
        return 0
    names = list(held_out)
    print("unknown tokens / sentences with an unknown token, per held-out set "
          f"({', '.join(f'{n}: {len(held_out[n][0])} pairs' for n in names)})")
    for side, rows in results.items():
        print(f"\n{side} | cap | min_frequency | words | " + " | ".join(names))
        for row in rows:
            cells = " | ".join(f"{100 * row[n]['tokens']:.2f}% / {100 * row[n]['sentences']:.1f}%"
                               if n in row else "-" for n in names)
            cap = row["cap"] or "none"
            print(f"{side} | {cap} | {row['min_frequency']} | {row['vocabulary']} | {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

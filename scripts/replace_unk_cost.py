"""What --replace-unk costs in decoding time, in its worst case: every output holds an [UNK].

An untrained model (d_model 256, 3 layers, word-level vocabularies of 16,000 words learnt from
50,000 Tatoeba pairs) whose output bias favours [UNK] translates 256 Tatoeba sentences with and
without replacement, taking turns, greedy and beam 4. CPU time of one thread is compared rather
than wall time, so that a shared machine's load counts less. The cost scales with the share of
outputs that hold an [UNK].

    python scripts/replace_unk_cost.py
"""

import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformer_mt.config import DecodeConfig, ModelConfig, TokenizerConfig  # noqa: E402
from transformer_mt.model import build_model  # noqa: E402
from transformer_mt.tokenizer import TextCodec, train_tokenizer  # noqa: E402
from transformer_mt.translator import Translator  # noqa: E402

TATOEBA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tatoeba-en-it" / "en-it.tsv"


def main() -> int:
    torch.set_num_threads(1)
    lines = TATOEBA.read_text(encoding="utf-8").splitlines()
    random.Random(0).shuffle(lines)
    pairs = [line.split("\t") for line in lines]
    train, test = pairs[:50_000], [p[0] for p in pairs[-256:]]
    vocab = TokenizerConfig(min_frequency=2, max_vocab=16_000)
    src = TextCodec(train_tokenizer([p[0] for p in train], vocab))
    tgt = TextCodec(train_tokenizer([p[1] for p in train], vocab))
    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=256, layers=3, heads=4, d_ff=1024, dropout=0.0,
                                    tie_embeddings=True), src.vocab_size, tgt.vocab_size)
    with torch.no_grad():
        model.projection.bias[tgt.unk_id] = 2.0
    base = Translator(model, src, tgt, DecodeConfig(max_len_a=1.0, max_len_b=5),
                      torch.device("cpu"))
    translators = {replace: base.with_decoding(replace_unk=replace)
                   for replace in (False, True)}
    for beam in (1, 4):
        seconds = {False: 0.0, True: 0.0}
        for _ in range(2):
            for replace, translator in translators.items():
                started = time.process_time()
                _, counts = translator.with_decoding(beam_size=beam).translate_counting(test)
                seconds[replace] += time.process_time() - started
        print(f"beam {beam}: outputs with [UNK] {counts.outputs_with_unknown / counts.outputs:.3f}"
              f"; CPU time with / without replacement {seconds[True] / seconds[False]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

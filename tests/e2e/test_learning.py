"""A system test in the fairseq tradition: a tiny model must learn to copy (BLEU >= 90)."""

import random

from conftest import write_tsv

from transformer_mt.cli import main
from transformer_mt.evaluate import corpus_scores
from transformer_mt.pipeline import load_data
from transformer_mt.rundir import RunDir
from transformer_mt.translator import Translator


def test_tiny_model_learns_to_copy(tmp_path):
    rng = random.Random(0)
    words = [f"w{i}" for i in range(24)]
    pairs = []
    for _ in range(4000):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(3, 9)))
        pairs.append((sentence, sentence))
    corpus = write_tsv(tmp_path / "copy.tsv", pairs)
    config = tmp_path / "copy.yaml"
    config.write_text(f"""
data: {{source: tsv, path: {corpus}, valid_size: 100, test_size: 200}}
tokenizer: {{min_frequency: 1}}
model: {{d_model: 64, layers: 2, heads: 4, d_ff: 256, dropout: 0.0}}
train: {{batch_tokens: 1500, lr: 0.003, warmup_steps: 50, max_steps: 300, label_smoothing: 0.0,
        valid_every: 1000, checkpoint_every: 1000, log_every: 50}}
decode: {{valid_sentences: 100}}
""")
    run_dir = tmp_path / "run"
    assert main(["train", "--config", str(config), "--run-dir", str(run_dir)]) == 0
    test = load_data(RunDir(run_dir)).splits.test
    translator = Translator.from_checkpoint(run_dir / "checkpoints" / "last.pt", "cpu")
    score = corpus_scores(translator.translate(test["src"]), test["tgt"])
    assert score.bleu >= 90, score

"""Shared fixtures. Tests never touch the network: the hub is switched off for the whole session."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_mt.openmp import configure_openmp

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
# Before any test module imports torch: as `tmt` does (see transformer_mt/openmp.py); on a busy
# machine the in-process training tests otherwise run ~30x slower.
configure_openmp()

ROOT = Path(__file__).resolve().parent.parent
TATOEBA = ROOT.parent / "shared" / "data" / "tatoeba-en-it" / "en-it.tsv"

# Used only where ../shared/data is absent: real-looking pairs, varied enough to train on.
_FALLBACK = [
    ("I love reading books.", "Amo leggere libri."), ("Where is the station?", "Dov'è la stazione?"),
    ("Tom is my friend.", "Tom è mio amico."), ("I don't know.", "Non lo so."),
    ("She said \"hello\".", "Ha detto \"ciao\"."), ("It costs 3.50 euros.", "Costa 3,50 euro."),
    ("The man is here.", "L'uomo è qui."), ("We are hungry.", "Abbiamo fame."),
    ("Open the door, please.", "Apri la porta, per favore."), ("I'm tired.", "Sono stanco."),
    ("Do you speak Italian?", "Parli italiano?"), ("The cat sleeps.", "Il gatto dorme."),
]
_SUBJECTS = [("I", "Io"), ("You", "Tu"), ("Tom", "Tom"), ("Mary", "Mary"), ("We", "Noi")]
_OBJECTS = [("the book", "il libro"), ("the car", "la macchina"), ("an apple", "una mela"),
            ("the house", "la casa"), ("a letter", "una lettera"), ("the dog", "il cane")]
_VERBS = [("see", "vedo"), ("want", "voglio"), ("have", "ho"), ("like", "amo")]


def fallback_pairs() -> list[tuple[str, str]]:
    pairs = list(_FALLBACK)
    for (s, si), (o, oi), (v, vi) in ((s, o, v) for s in _SUBJECTS for o in _OBJECTS
                                      for v in _VERBS):
        pairs.append((f"{s} {v} {o}.", f"{si} {vi} {oi}."))
    return pairs


# For the tests whose property needs real sentences (a 2,000-subword vocabulary, two corpora
# with different vocabularies, 150k distinct long pairs, a random model whose outputs vary):
# the fixture's 132 short pairs cannot give them.
needs_real_text = pytest.mark.skipif(not TATOEBA.is_file(), reason="needs real sentences: "
                                     "../shared/data is absent (the fixture has 132 pairs)")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


needs_cuda = pytest.mark.skipif(not _cuda_available(), reason="no CUDA device")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=needs_cuda)])
def device(request):
    """Each test that takes `device` runs on the CPU and, where there is one, on a CUDA GPU:
    the same properties must hold on the bf16-autocast path (transformer_mt/device.py)."""
    import torch

    return torch.device(request.param)


def sample_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n real Tatoeba pairs when ../shared/data is present, else the built-in fixture."""
    if TATOEBA.is_file():
        lines = TATOEBA.read_text(encoding="utf-8").splitlines()
        rng = random.Random(seed)
        return [tuple(line.split("\t")) for line in rng.sample(lines, n)]
    pairs = fallback_pairs()
    return [pairs[i % len(pairs)] for i in range(n)]


def write_tsv(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def corpus_tsv(tmp_path_factory) -> Path:
    """A few hundred real sentence pairs in the Tatoeba TSV layout."""
    return write_tsv(tmp_path_factory.mktemp("corpus") / "pairs.tsv", sample_pairs(600))


def tiny_config_text(corpus: Path, **train) -> str:
    train_lines = "".join(f"  {k}: {v}\n" for k, v in train.items())
    return f"""name: test
data:
  source: tsv
  path: {corpus}
  valid_size: 30
  test_size: 30
tokenizer:
  min_frequency: 1
model:
  d_model: 32
  layers: 1
  heads: 2
  d_ff: 64
train:
  batch_tokens: 512
  lr: 0.003
  warmup_steps: 10
  log_every: 2
  valid_every: 5
  checkpoint_every: 3
{train_lines}decode:
  valid_sentences: 20
"""


@pytest.fixture
def tiny_config(tmp_path, corpus_tsv) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_config_text(corpus_tsv, max_steps=6), encoding="utf-8")
    return path


def run_tmt(*args: str, cwd: Path | None = None, stdin: str | None = None,
            timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the real `tmt` command (as `python -m transformer_mt`, same interpreter), with `env`
    added to this process's environment."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "transformer_mt", *args], cwd=cwd,
                          input=stdin, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="session")
def varied_model(tmp_path_factory, corpus_tsv) -> Path:
    """A checkpoint inside a tiny run whose outputs differ from sentence to sentence: the run
    is trained for 6 steps (for its tokenizers, split and config), then its weights are
    replaced by a seeded random initialisation (a barely trained model answers "." to
    everything, and tests of serving and export must tell translations apart)."""
    import torch

    from transformer_mt.checkpoint import atomic_save, load_checkpoint
    from transformer_mt.config import config_from_dict
    from transformer_mt.model import build_model

    folder = tmp_path_factory.mktemp("varied")
    config = folder / "tiny.yaml"
    config.write_text(tiny_config_text(corpus_tsv, max_steps=6), encoding="utf-8")
    result = run_tmt("train", "--config", str(config), "--run-dir", str(folder / "run"))
    assert result.returncode == 0, result.stderr
    state = load_checkpoint(folder / "run" / "checkpoints" / "last.pt")
    cfg = config_from_dict(state["config"])
    torch.manual_seed(0)
    model = build_model(cfg.model, state["vocab"]["src"], state["vocab"]["tgt"])
    state["model"] = model.state_dict()
    path = folder / "run" / "checkpoints" / "varied.pt"
    atomic_save(state, path)
    return path

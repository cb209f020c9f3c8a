"""Benchmark: training throughput, MFU, padding, memory and decoding speed, on this machine.

    python scripts/bench.py                      # --preset small, human-readable
    python scripts/bench.py --preset base --json # one JSON object on stdout
    torchrun --nproc_per_node=2 scripts/bench.py --json   # data-parallel training throughput

Everything runs through the project's own code: tokenizers from `transformer_mt.tokenizer`,
token ids in a `TokenStore`, `TokenBatchSampler` + `Collator` batches through the
DataLoader of `make_loader`,
the model from `build_model`, optimizer steps through `TrainStep` (loss, backward, clip,
Adam, Noam) and decoding through `Translator` (greedy and beam search on the key/value cache).
The model is untrained: speed does not depend on the weights, and an untrained model rarely
emits [EOS], so every output runs to `--decode-len` tokens (the reference's 1.1 sentences/s was
measured with 12).

Absolute times drift on a shared machine, so the figures that matter are ratios measured in the
same run: MFU against a GEMM rate probed between the training steps (so both see the same load),
and cached against uncached decoding of the same sentences by the same model.

Under torchrun the training part runs data-parallel exactly as `tmt train` does (DDP, the batch
plan partitioned across ranks, gradients all-reduced): `train_tokens_per_s` counts the target
tokens of all ranks, `gemm_gflops` is the sum of the ranks' probes (they run at the same moments,
so together they measure the machine), `peak_rss_mb` is the largest rank's. Decoding is not
distributed in `tmt`, so it is left out; rank 0 prints the result.

Model FLOPs are counted by `transformer_mt.model.flops` (its docstring gives the formula) and
compared with the matrix-multiply rate its `MatmulProbe` measures between the training steps.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from transformer_mt.allocator import allocator_in_use, reexec_with_tcmalloc
from transformer_mt.openmp import configure_openmp

reexec_with_tcmalloc()              # the allocator tmt train runs with (TMT_ALLOCATOR=system: glibc)
configure_openmp()                  # before torch is imported

import torch
import torch.nn.functional as F

from transformer_mt.arrow_io import column
from transformer_mt.batching import Batch, Collator, TokenBatchSampler, make_loader
from transformer_mt.config import Config, DataConfig, DecodeConfig, ModelConfig, TokenizerConfig, TrainConfig
from transformer_mt.corpus import clean_pairs
from transformer_mt.device import pick_device
from transformer_mt.distributed import (
    DistInfo,
    broadcast_from_main,
    exit_process,
    init_distributed,
    joined,
    max_across_ranks,
    shutdown,
    sum_across_ranks,
)
from transformer_mt.distributed import active as dist_active
from transformer_mt.model import build_model, count_parameters
from transformer_mt.model.flops import MatmulProbe, training_flops
from transformer_mt.model.masks import source_tensor, src_pad_mask
from transformer_mt.readers import load_corpus
from transformer_mt.search import greedy_search
from transformer_mt.token_store import TokenStore, write_token_store
from transformer_mt.tokenizer import TextCodec, normalize_text, train_tokenizer
from transformer_mt.train_step import TrainStep
from transformer_mt.training import trainable_pairs
from transformer_mt.translator import Translator

ROOT = Path(__file__).resolve().parent.parent
TATOEBA = ROOT.parent / "shared" / "data" / "tatoeba-en-it" / "en-it.tsv"
REFERENCE_SOURCE_LENGTH = 350     # the reference pads every source sentence to this length

PRESETS = {
    # configs/tatoeba_en_it_word.yaml's model
    "small": ModelConfig(d_model=256, layers=3, heads=4, d_ff=1024, tie_embeddings=True),
    # the paper's base model (configs/opus_books_en_it.yaml)
    "base": ModelConfig(d_model=512, layers=6, heads=8, d_ff=2048),
}


# --------------------------------------------------------------------------- data

def read_pairs(path: Path, max_lines: int | None, seed: int) -> tuple[list[str], list[str], str]:
    """Cleaned pairs of the Tatoeba TSV file (read and cleaned as `tmt train` reads and cleans
    it), or a synthetic corpus of Tatoeba-like lengths when the file is absent."""
    if path.is_file():
        data_cfg = DataConfig(source="tsv", path=str(path), max_len=40)
        with tempfile.TemporaryDirectory(prefix="bench.") as work:
            corpus = load_corpus(data_cfg, Path(work))
            if max_lines is not None and max_lines < len(corpus):
                corpus = corpus.select(random.Random(seed).sample(range(len(corpus)), max_lines))
            src, tgt = clean_pairs(column(corpus, "src"), column(corpus, "tgt"), data_cfg)
        return src, tgt, str(path)
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(20000)]
    weights = [1.0 / (rank + 1) for rank in range(len(words))]      # Zipf-like word frequencies

    def sentence() -> str:
        return " ".join(rng.choices(words, weights, k=max(2, int(rng.gauss(7, 3))))) + "."
    n = max_lines or 100_000
    return [sentence() for _ in range(n)], [sentence() for _ in range(n)], "synthetic"


@dataclass
class Corpus:
    src_codec: TextCodec
    tgt_codec: TextCodec
    train: TokenStore            # the pairs training batches are drawn from
    decode_sources: list[str]    # sentences to translate, none of them in `train`
    origin: str
    store_dir: tempfile.TemporaryDirectory   # holds `train`'s files while the benchmark runs


def build_corpus(args: argparse.Namespace) -> Corpus:
    src, tgt, origin = read_pairs(Path(args.data), args.corpus_lines, args.seed)
    tokenizer_cfg = TokenizerConfig(min_frequency=2, max_vocab=args.max_vocab)
    src_codec = TextCodec(train_tokenizer(src, tokenizer_cfg))
    tgt_codec = TextCodec(train_tokenizer(tgt, tokenizer_cfg))
    order = list(range(len(src)))
    random.Random(args.seed).shuffle(order)
    decode_rows, train_rows = order[:args.decode_sentences], order[args.decode_sentences:]
    train_rows = train_rows[:args.train_pairs]

    def encoded(rows: list[int], size: int = 2000) -> Iterator[tuple[list, list]]:
        for start in range(0, len(rows), size):
            chunk = rows[start:start + size]
            yield (src_codec.encode_batch([src[i] for i in chunk]),
                   tgt_codec.encode_batch([tgt[i] for i in chunk]))
    # Ids on disk, as tmt keeps them: Python lists of ids would hold ~0.3 GB of the peak memory.
    store_dir = tempfile.TemporaryDirectory(prefix="tmt-bench-")
    train = write_token_store(Path(store_dir.name) / "train", encoded(train_rows),
                              src_codec.vocab_size, tgt_codec.vocab_size)
    return Corpus(src_codec, tgt_codec, train, [src[i] for i in decode_rows], origin, store_dir)


# --------------------------------------------------------------------------- training

@dataclass
class TrainResult:
    tokens_per_s: float
    tokens_per_step: float
    flops_per_token: float
    achieved_gflops: float
    steps: int
    seconds: float
    padding_efficiency: float
    parameters: int


def bench_training(args: argparse.Namespace, corpus: Corpus, model_cfg: ModelConfig,
                   device: torch.device, probe: MatmulProbe, dist_info: DistInfo) -> TrainResult:
    train_cfg = TrainConfig(batch_tokens=args.batch_tokens, seed=args.seed,
                            num_workers=args.num_workers, warmup_steps=4000,
                            recompute=args.recompute, accumulate=args.accumulate)
    cfg = Config(model=model_cfg, train=train_cfg)
    src_codec, tgt_codec = corpus.src_codec, corpus.tgt_codec
    torch.manual_seed(args.seed)        # the same initial weights on every rank
    model = build_model(model_cfg, src_codec.vocab_size, tgt_codec.vocab_size).to(device)
    train_step = TrainStep(cfg, model, device, tgt_codec.pad_id, dist_info)
    # The pairs and batch plan of `tmt train`, each rank its share.
    pairs, lengths = trainable_pairs(corpus.train, cfg.data.max_len)
    sampler = TokenBatchSampler(lengths, train_cfg.batch_tokens, train_cfg.seed,
                                rank=dist_info.rank, world_size=dist_info.world_size)
    collator = Collator(src_codec, tgt_codec)
    padding = sampler.padding_efficiency(pairs)

    def epochs() -> Iterator[Batch]:
        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            yield from make_loader(pairs, sampler, collator, args.num_workers)
    batches = epochs()
    updates = 0

    def step() -> tuple[float, float]:
        """One optimizer step over `accumulate` batches, as `tmt train` groups them; its target
        tokens and model FLOPs, summed over the ranks."""
        nonlocal updates
        group = list(itertools.islice(batches, train_cfg.accumulate))
        tokens = train_step(group, updates).tokens
        updates += 1
        flops = 0.0
        for batch in group:
            src_len = (batch.src != src_codec.pad_id).sum(dim=1)
            tgt_len = (batch.tgt_out != tgt_codec.pad_id).sum(dim=1)
            flops += training_flops(model_cfg, tgt_codec.vocab_size, src_len, tgt_len)
        return tokens, sum_across_ranks(flops, device)

    for _ in range(args.warmup_steps):
        step()
    tokens = flops = seconds = 0.0
    steps = 0
    # Every rank must take the same number of steps: rank 0's clock decides when to stop.
    while not broadcast_from_main(steps >= args.min_train_steps and seconds >= args.train_seconds):
        started = time.perf_counter()
        step_tokens, step_flops = step()
        step_seconds = time.perf_counter() - started
        tokens, flops, seconds, steps = tokens + step_tokens, flops + step_flops, \
            seconds + step_seconds, steps + 1
        # Probe for a fixed share of the step's time, so each step's load is sampled alike.
        probe.sample(args.gemm_share * step_seconds)
    return TrainResult(tokens / seconds, tokens / steps, flops / tokens, flops / seconds / 1e9,
                       steps, seconds, padding, count_parameters(model))


# --------------------------------------------------------------------------- decoding

def _timed(function, *args, **kwargs):
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


def uncached_reference(model, translator: Translator, sources: list[str]) -> list[list[int]]:
    """The reference's decoding: one sentence at a time, its source padded to 350 positions,
    the whole prefix re-decoded with a causal mask at every step (cross-attention keys and
    values recomputed too), no cache."""
    codec = translator.src_codec
    outputs = []
    for sentence in sources:
        src = source_tensor([codec.encode(normalize_text(sentence))], codec)
        src = F.pad(src, (0, REFERENCE_SOURCE_LENGTH - src.size(1)), value=codec.pad_id)
        src = src.to(translator.device)
        outputs += greedy_search(model, src, src_pad_mask(src, codec.pad_id), translator.limits,
                                 use_cache=False)
    return outputs


def bench_decoding(args: argparse.Namespace, corpus: Corpus, model_cfg: ModelConfig,
                   device: torch.device) -> dict:
    torch.manual_seed(args.seed)
    model = build_model(model_cfg, corpus.src_codec.vocab_size, corpus.tgt_codec.vocab_size)
    decode_cfg = DecodeConfig(max_len_a=0.0, max_len_b=args.decode_len,
                              batch_size=args.decode_batch)
    translator = Translator(model, corpus.src_codec, corpus.tgt_codec, decode_cfg, device)
    sources = corpus.decode_sources
    translator.translate_ids(sources[:args.decode_batch])                  # warm-up
    reference_rows = sorted(random.Random(args.seed).sample(
        range(len(sources)), min(args.uncached_sentences, len(sources))))
    # The three methods take turns on slices of the sentences, so that each one's total time
    # spans the same stretch of (shared-machine) load.
    rounds = args.decode_rounds
    greedy: dict[int, list[list[int]]] = {}
    greedy_s = beam_s = uncached_s = 0.0
    same = 0
    for part in range(rounds):
        rows = range(part, len(sources), rounds)
        outputs, seconds = _timed(translator.translate_ids, [sources[i] for i in rows])
        greedy.update(zip(rows, outputs))
        greedy_s += seconds
        beam_s += _timed(translator.with_decoding(beam_size=4).translate_ids,
                         [sources[i] for i in rows])[1]
        part_rows = [i for i in reference_rows if i % rounds == part]
        outputs, seconds = _timed(uncached_reference, translator.model, translator,
                                  [sources[i] for i in part_rows])
        uncached_s += seconds
        same += sum(out == greedy[i][0] for out, i in zip(outputs, part_rows))
    greedy_rate = len(sources) / greedy_s
    uncached_rate = len(reference_rows) / uncached_s
    ct2 = bench_ctranslate2(translator, model_cfg, sources, greedy, greedy_rate, rounds)
    return {
        "decode_sentences": len(sources),
        "decode_batch": args.decode_batch,
        "decode_output_tokens_mean": sum(len(g[0]) for g in greedy.values()) / len(greedy),
        "greedy_sents_per_s": greedy_rate,
        "uncached_sentences": len(reference_rows),
        "uncached_sents_per_s": uncached_rate,
        "uncached_same_output": f"{same}/{len(reference_rows)}",
        "greedy_speedup": greedy_rate / uncached_rate,
        "beam4_sents_per_s": len(sources) / beam_s,
        "beam4_time_over_greedy": beam_s / greedy_s,
        **ct2,
    }


def bench_ctranslate2(translator: Translator, model_cfg: ModelConfig, sources: list[str],
                      greedy: dict[int, list[list[int]]], greedy_rate: float,
                      rounds: int) -> dict:
    """Greedy decoding of the same sentences by the same weights exported to CTranslate2
    (`tmt export --format ctranslate2`), float32 and int8, on as many threads; the speedup is
    over the cached PyTorch greedy rate above, which ran on `device` (a GPU, where there is one,
    while CTranslate2 runs on the CPU). Left out where ctranslate2 is not installed."""
    try:
        from transformer_mt.ctranslate import CT2Translator, build_spec, save_spec
    except ImportError:
        return {}
    rates, same = {}, 0
    with tempfile.TemporaryDirectory() as folder:
        for quantization in ("float32", "int8"):
            spec = build_spec(Config(model=model_cfg), translator.model.state_dict(),
                              translator.src_codec, translator.tgt_codec)
            save_spec(spec, Path(folder) / quantization, quantization)
            ct2 = CT2Translator(Path(folder) / quantization, translator.src_codec,
                                translator.tgt_codec, translator.decode_cfg, "cpu")
            ct2.translate_ids(sources[:translator.decode_cfg.batch_size])      # warm-up
            seconds = 0.0
            for part in range(rounds):
                rows = range(part, len(sources), rounds)
                outputs, elapsed = _timed(ct2.translate_ids, [sources[i] for i in rows])
                seconds += elapsed
                if quantization == "float32":
                    same += sum(out == greedy[i] for out, i in zip(outputs, rows))
            rates[quantization] = len(sources) / seconds
    return {"ct2_device": "cpu",
            "ct2_float32_greedy_sents_per_s": rates["float32"],
            "ct2_float32_same_output": f"{same}/{len(sources)}",
            "ct2_int8_greedy_sents_per_s": rates["int8"],
            "ct2_int8_speedup": rates["int8"] / greedy_rate}


# --------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="small")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--d-model", type=int, help="override the preset's d_model")
    p.add_argument("--layers", type=int, help="override the preset's layers")
    p.add_argument("--heads", type=int, help="override the preset's heads")
    p.add_argument("--d-ff", type=int, help="override the preset's d_ff")
    p.add_argument("--data", default=str(TATOEBA), help="Tatoeba TSV (synthetic if absent)")
    p.add_argument("--corpus-lines", type=int, help="read this many random lines (default all)")
    p.add_argument("--max-vocab", type=int, default=16000, help="as configs/tatoeba_en_it_word.yaml")
    p.add_argument("--train-pairs", type=int, help="pairs batches come from (default: all)")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--accumulate", type=int, default=1,
                   help="train.accumulate: batches per optimizer step (--batch-tokens 2048 "
                        "--accumulate 2 updates on 4,096 tokens with half the activations)")
    p.add_argument("--recompute", action="store_true",
                   help="train.recompute: recompute activations in the backward pass")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers")
    p.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first")
    p.add_argument("--train-seconds", type=float, default=60.0, help="timed training, at least")
    p.add_argument("--min-train-steps", type=int, default=5)
    p.add_argument("--gemm-size", type=int,
                   help="square matmul of the GEMM probe (default 2048 on CPU, 8192 on CUDA)")
    p.add_argument("--gemm-share", type=float, default=0.25,
                   help="GEMM probing time after each step, as a fraction of the step's time")
    p.add_argument("--decode-sentences", type=int, default=512)
    p.add_argument("--decode-batch", type=int, default=128)
    p.add_argument("--decode-len", type=int, default=12, help="output tokens per sentence")
    p.add_argument("--decode-rounds", type=int, default=4,
                   help="greedy, beam and uncached decoding alternate over this many slices")
    p.add_argument("--uncached-sentences", type=int, default=8,
                   help="sentences decoded the reference's way (it is slow: rates are per "
                        "sentence)")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def model_config(args: argparse.Namespace) -> ModelConfig:
    overrides = {key: getattr(args, key) for key in ("d_model", "layers", "heads", "d_ff")
                 if getattr(args, key) is not None}
    return replace(PRESETS[args.preset], **overrides)


def run(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    dist_info, device_name = init_distributed(args.device)
    device = pick_device(device_name)
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    corpus = build_corpus(args)
    model_cfg = model_config(args)
    vocab = {"src": corpus.src_codec.vocab_size, "tgt": corpus.tgt_codec.vocab_size}
    gemm_size = args.gemm_size or (8192 if device.type == "cuda" else 2048)
    probe = MatmulProbe(device, gemm_size)
    train = bench_training(args, corpus, model_cfg, device, probe, dist_info)
    # Decoding is not data-parallel in tmt: under torchrun only training is measured.
    decode = {} if dist_info.enabled else bench_decoding(args, corpus, model_cfg, device)
    gemm_gflops = sum_across_ranks(probe.gflops, device)
    peak_rss_mb = max_across_ranks(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                                   device)
    return {
        "preset": args.preset,
        "device": device.type,
        "world_size": dist_info.world_size,
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "data": corpus.origin,
        "gemm_gflops": gemm_gflops,
        "gemm": f"{gemm_size}x{gemm_size} {str(probe.dtype).replace('torch.', '')}",
        "model": {"d_model": model_cfg.d_model, "layers": model_cfg.layers,
                  "heads": model_cfg.heads, "d_ff": model_cfg.d_ff,
                  "src_vocab": vocab["src"], "tgt_vocab": vocab["tgt"],
                  "tie_embeddings": model_cfg.tie_embeddings, "parameters": train.parameters},
        "batch_tokens": args.batch_tokens,
        "accumulate": args.accumulate,
        "recompute": args.recompute,
        "train_steps": train.steps,
        "train_tokens_per_s": train.tokens_per_s,
        "train_tokens_per_step": train.tokens_per_step,
        "model_flops_per_token": train.flops_per_token,
        "achieved_gflops": train.achieved_gflops,
        "mfu": train.achieved_gflops / gemm_gflops,
        "padding_efficiency": train.padding_efficiency,
        "peak_rss_mb": peak_rss_mb,
        "allocator": allocator_in_use(),
        **decode,
        "wall_seconds": time.perf_counter() - started,
    }


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
        is_main = not dist_active() or torch.distributed.get_rank() == 0
    finally:
        shutdown()
    if is_main:
        if args.json:
            print(json.dumps(result))
        else:
            for key, value in result.items():
                print(f"{key:28s} {_format(value)}")
    if joined():
        exit_process(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

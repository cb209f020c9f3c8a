"""Corpus-level BLEU and chrF with sacreBLEU, on detokenized output against raw references, and
`tmt evaluate`: translate a test set, score it, and write the hypotheses with a JSON report."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import sacrebleu

from .arrow_io import column
from .errors import TmtError
from .paths import report_path
from .pipeline import load_held_out_split
from .rundir import RunDir
from .textio import read_text_lines
from .translator import Translator


@dataclass(frozen=True)
class Scores:
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    bleu_details: str = ""      # sacreBLEU's line: n-gram precisions, brevity penalty, lengths


def corpus_scores(hypotheses: list[str], references: list[str]) -> Scores:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return Scores(bleu=bleu_score.score, chrf=chrf_score.score,
                  bleu_signature=str(bleu.get_signature()),
                  chrf_signature=str(chrf.get_signature()),
                  bleu_details=str(bleu_score))


# --------------------------------------------------------------------------- test sets

@dataclass(frozen=True)
class EvalSet:
    name: str                    # names the output files: "test" or the source file's stem
    sources: list[str]
    references: list[str]


def file_test_set(src: Path, ref: Path) -> EvalSet:
    """Line-aligned source and reference files; the references are scored as they are."""
    sources, references = read_text_lines(src), read_text_lines(ref)
    if len(sources) != len(references):
        raise TmtError(f"{src} has {len(sources)} lines but {ref} has {len(references)}; "
                       f"source and reference files must be line-aligned")
    return EvalSet(src.stem, sources, references)


def run_held_out_set(run: RunDir, split: str = "test") -> EvalSet:
    """The run's own held-out test split (no sentence of it was trained or validated on), or
    with `split="valid"` its whole validation split: the one to choose decoding settings and
    checkpoints on, so that the test split is scored once, with choices it did not make."""
    held_out = load_held_out_split(run, split)
    if len(held_out) == 0:
        raise TmtError(f"{run.path} has an empty {split} split (data.{split}_size: 0); "
                       f"evaluate on files with --src FILE --ref FILE")
    return EvalSet(split, column(held_out, "src"), column(held_out, "tgt"))


# --------------------------------------------------------------------------- evaluation

def evaluate(translator: Translator, test: EvalSet, checkpoint: Path) -> tuple[list[str], dict]:
    """Translate `test` with the translator's decoding settings and score it. Returns the
    hypotheses (line-aligned with the references) and the report: scores, signatures, decoding
    settings, checkpoint, time, speed."""
    # A source with several references (as in Tatoeba) is translated once.
    unique = list(dict.fromkeys(test.sources))
    decode = translator.decode_cfg
    started = time.perf_counter()
    outputs, unknown = translator.translate_counting(unique)
    translated = dict(zip(unique, outputs))
    seconds = time.perf_counter() - started
    hypotheses = [translated[s] for s in test.sources]
    scores = corpus_scores(hypotheses, test.references)
    report = {
        "bleu": round(scores.bleu, 2), "chrf": round(scores.chrf, 2),
        "signature": scores.bleu_signature, "chrf_signature": scores.chrf_signature,
        "bleu_details": scores.bleu_details,
        "sentences": len(test.sources), "translated": len(unique), "test_set": test.name,
        "decoding": {"beam_size": decode.beam_size, "length_penalty": decode.length_penalty,
                     "batch_size": decode.batch_size, "batch_tokens": decode.batch_tokens,
                     "max_len_a": decode.max_len_a, "max_len_b": decode.max_len_b,
                     "device": str(translator.device)},
        # Shares of the distinct sources: unknown source tokens, sources with one, and
        # outputs that held an [UNK] before it was replaced.
        **unknown.shares(), "replace_unk": translator.replace_unk,
        "checkpoint": str(checkpoint),
        "seconds": round(seconds, 2),
        "sentences_per_s": round(len(unique) / max(seconds, 1e-9), 2),
    }
    return hypotheses, report


def default_output(checkpoint: Path, test: EvalSet, beam_size: int) -> Path:
    """`<run>/eval/<test set>.<checkpoint>.beam<K>.hyp` when the checkpoint lies in a run's
    checkpoints/ folder, else beside the checkpoint."""
    folder = checkpoint.parent
    if folder.name == "checkpoints":
        folder = folder.parent / "eval"
    return folder / f"{test.name}.{checkpoint.stem}.beam{beam_size}.hyp"


def write_outputs(hypotheses: list[str], report: dict, hyp_path: Path) -> Path:
    """Write the hypotheses (one per line) and the report as JSON beside them; returns the
    report's path. The report records where the hypotheses are."""
    try:
        hyp_path.parent.mkdir(parents=True, exist_ok=True)
        hyp_path.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
        report["hypotheses"] = str(hyp_path)
        json_path = report_path(hyp_path)
        json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise TmtError(f"could not write {hyp_path}: {exc.strerror or exc}; choose another "
                       f"place with --output FILE") from None
    return json_path

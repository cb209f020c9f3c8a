"""Corpus-level BLEU and chrF with sacreBLEU, on detokenized output against raw references."""

from __future__ import annotations

from dataclasses import dataclass

import sacrebleu


@dataclass(frozen=True)
class Scores:
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str


def corpus_scores(hypotheses: list[str], references: list[str]) -> Scores:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return Scores(bleu=bleu_score.score, chrf=chrf_score.score,
                  bleu_signature=str(bleu.get_signature()),
                  chrf_signature=str(chrf.get_signature()))

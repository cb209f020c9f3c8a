"""Validation during training: loss on the validation pairs, translation of the first
decode.valid_sentences sentences scored with BLEU/chrF, and what TensorBoard shows of it
(scores, sample translations, cross-attention images)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils.tensorboard import SummaryWriter

from .batching import Batch, Collator, TokenBatchSampler, make_loader
from .config import Config
from .evaluate import corpus_scores
from .pipeline import RunData
from .translator import Translator

SAMPLE_TRANSLATIONS = 5


@dataclass
class ValidationResult:
    loss: float                         # per real target token
    bleu: float
    chrf: float
    samples: list[tuple[str, str, str]]   # (source, reference, hypothesis), the first few

    @property
    def ppl(self) -> float:
        return math.exp(min(self.loss, 50))


class Validator:
    """`batch_loss(batch)`: the summed loss of a batch already on the device (the trainer's)."""

    def __init__(self, cfg: Config, data: RunData, translator: Translator,
                 batch_loss: Callable[[Batch], torch.Tensor]):
        self.cfg, self.data, self.translator, self.batch_loss = cfg, data, translator, batch_loss
        self.sampler = TokenBatchSampler(data.valid.lengths(), cfg.train.batch_tokens,
                                         cfg.train.seed, shuffle=False)
        self.collator = Collator(data.src_codec, data.tgt_codec)

    @torch.no_grad()
    def __call__(self) -> ValidationResult:
        self.translator.model.eval()
        loss_sum, tokens = 0.0, 0
        self.sampler.set_epoch(0)
        for batch in make_loader(self.data.valid, self.sampler, self.collator):
            loss_sum += self.batch_loss(batch.to(self.translator.device)).item()
            tokens += batch.n_tokens
        splits, decode = self.data.splits, self.cfg.decode
        valid = splits.valid.select(range(min(decode.valid_sentences, len(splits.valid))))
        hypotheses = self.translator.translate(valid["src"])
        scores = corpus_scores(hypotheses, valid["tgt"])
        samples = list(zip(valid["src"], valid["tgt"], hypotheses))[:SAMPLE_TRANSLATIONS]
        return ValidationResult(loss_sum / max(tokens, 1), scores.bleu, scores.chrf, samples)


def log_validation(writer: SummaryWriter, result: ValidationResult, translator: Translator,
                   step: int) -> None:
    """Scores, the sample translations and each sample's cross-attention, to TensorBoard."""
    # matplotlib (imported by attention_plot) is loaded only once an image is drawn.
    from .attention_plot import attention_figure, cross_attention

    for key in ("loss", "ppl", "bleu", "chrf"):
        writer.add_scalar(f"valid/{key}", getattr(result, key), step)
    text = "\n\n".join(f"**src** {s}  \n**ref** {r}  \n**hyp** {h}" for s, r, h in result.samples)
    writer.add_text("valid/samples", text, step)
    for i, (source, _, _) in enumerate(result.samples):
        alignment = cross_attention(translator, source)
        writer.add_figure(f"valid/attention/{i}", attention_figure(alignment), step)

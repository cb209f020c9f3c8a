"""Translate text with a trained model: normalise, encode, batch by length, search, detokenize."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from pathlib import Path
from typing import Any, Iterator

import torch

from .checkpoint import Checkpoint, check_fits, read_checkpoint
from .config import DecodeConfig
from .device import pick_device
from .model import Transformer, build_model
from .model.masks import source_tensor, src_pad_mask
from .search import Hypothesis, SearchLimits, beam_search, greedy_search, top_k_sampler
from .tokenizer import TextCodec, normalize_text
from .unk import UnknownCounts, attended_source_tokens, unknown_replacements

log = logging.getLogger(__name__)


class Translator:
    """Translates with the decoding settings of one `DecodeConfig` (the run's `decode` section,
    with any changes): beam size, length penalty, length cap, sampling, [UNK] replacement.
    `with_decoding` makes a translator that shares the model and decodes otherwise."""

    def __init__(self, model: Transformer, src_codec: TextCodec, tgt_codec: TextCodec,
                 decode_cfg: DecodeConfig, device: torch.device):
        self.model = model.to(device).eval()
        self.src_codec, self.tgt_codec = src_codec, tgt_codec
        self.decode_cfg = decode_cfg
        self.device = device
        self.generator: torch.Generator | None = None      # seeds sampling (decode.sample_topk)

    @property
    def replace_unk(self) -> bool:
        """Write each [UNK] of an output as the source word it attends to most (`unk.py`);
        decode.replace_unk null: on for word-level target vocabularies, off for subword ones
        (whose only unknowns are unseen characters)."""
        setting = self.decode_cfg.replace_unk
        return self.tgt_codec.word_level if setting is None else setting

    @property
    def limits(self) -> SearchLimits:
        decode = self.decode_cfg
        return SearchLimits(self.tgt_codec.sos_id, self.tgt_codec.eos_id, decode.max_len_a,
                            decode.max_len_b)

    @classmethod
    def from_checkpoint(cls, path: Path, device: str = "auto",
                        **decode_changes: Any) -> "Translator":
        """`decode_changes` override the run's decode settings, e.g. batch_tokens=2000."""
        return cls.from_state(read_checkpoint(path), str(path), device, **decode_changes)

    @classmethod
    def from_state(cls, checkpoint: Checkpoint, where: str, device: str = "auto",
                   **decode_changes: Any) -> "Translator":
        """As `from_checkpoint`, from a checkpoint already loaded from `where`."""
        cfg = checkpoint.settings(where)
        src_codec, tgt_codec = checkpoint.codecs()
        model = build_model(cfg.model, src_codec.vocab_size, tgt_codec.vocab_size,
                            cfg.tokenizer.joint)
        # A checkpoint whose weights disagree with its own config or vocabularies (damaged or
        # edited by hand) is refused with one line instead of load_state_dict's traceback.
        check_fits(checkpoint, model, Path(where),
                   "its weights do not match its own config and vocabularies (a damaged or "
                   "edited checkpoint)")
        model.load_state_dict(checkpoint.model)
        decode_cfg = dataclasses.replace(cfg.decode, **decode_changes)
        return cls(model, src_codec, tgt_codec, decode_cfg, pick_device(device))

    def with_decoding(self, seed: int | None = None, **decode_changes: Any) -> "Translator":
        """A translator that shares this one's model but decodes with other settings (e.g.
        beam_size=4, max_len_a=2.0, sample_topk=10); `seed` makes its sampling repeatable."""
        other = copy.copy(self)
        other.decode_cfg = dataclasses.replace(self.decode_cfg, **decode_changes)
        other.generator = torch.Generator().manual_seed(seed) if seed is not None else None
        return other

    def encode_source(self, sentence: str) -> list[int]:
        ids = self.src_codec.encode(normalize_text(sentence))
        limit = self.decode_cfg.max_input_tokens
        if len(ids) > limit:
            log.warning("input of %d tokens truncated to decode.max_input_tokens=%d: %.40s...",
                        len(ids), limit, sentence)
            ids = ids[:limit]
        return ids

    def _batches(self, encoded: list[list[int]]) -> Iterator[list[int]]:
        """Indices of the non-empty inputs, sorted by length so that each batch pads little, in
        batches of at most decode.batch_size sentences and decode.batch_tokens padded source
        tokens ([SOS] and [EOS] included)."""
        order = sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: len(encoded[i]))
        size, budget = self.decode_cfg.batch_size, self.decode_cfg.batch_tokens
        batch: list[int] = []
        for i in order:
            # Sorted order: the newest sentence is the longest, so it sets the padded width.
            width = len(encoded[i]) + 2
            over_budget = budget is not None and (len(batch) + 1) * width > budget
            if batch and (len(batch) == size or over_budget):
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch

    def search(self, sentences: list[str], nbest: int = 1) -> list[list[Hypothesis]]:
        """Up to `nbest` hypotheses per sentence, best first, from a beam of decode.beam_size
        (at least `nbest`); an empty input gives one empty hypothesis. Greedy search (beam 1)
        does not score: its score is nan; with decode.sample_topk it samples instead."""
        encoded = [self.encode_source(s) for s in sentences]
        decode = self.decode_cfg
        beam_size = max(decode.beam_size, nbest)
        sampler = (top_k_sampler(decode.sample_topk, decode.temperature, self.generator)
                   if decode.sample_topk else None)
        results = [[Hypothesis([], 0.0)] for _ in sentences]
        for chunk in self._batches(encoded):
            src = source_tensor([encoded[i] for i in chunk], self.src_codec).to(self.device)
            mask = src_pad_mask(src, self.src_codec.pad_id)
            if beam_size == 1:
                outputs = [[Hypothesis(ids, math.nan)]
                           for ids in greedy_search(self.model, src, mask, self.limits,
                                                    pick_next=sampler)]
            else:
                outputs = beam_search(self.model, src, mask, self.limits, beam_size,
                                      decode.length_penalty, nbest)
            for i, out in zip(chunk, outputs):
                results[i] = out
        return results

    def translate_ids(self, sentences: list[str], nbest: int = 1) -> list[list[list[int]]]:
        """Up to `nbest` token-id outputs per sentence. Empty input gives one empty output."""
        return [[h.tokens for h in hyps] for hyps in self.search(sentences, nbest)]

    def translate(self, sentences: list[str]) -> list[str]:
        best = [outputs[0] for outputs in self.translate_ids(sentences)]
        return self.detokenize(sentences, best)

    def translate_counting(self, sentences: list[str]) -> tuple[list[str], UnknownCounts]:
        """Translations, and how many source tokens and outputs held an [UNK] (before any
        replacement)."""
        best = [outputs[0] for outputs in self.translate_ids(sentences)]
        counts = UnknownCounts()
        for sentence, output in zip(sentences, best):
            counts.add_source(self.src_codec.encode(normalize_text(sentence)),
                              self.src_codec.unk_id)
            counts.add_output(output, self.tgt_codec.unk_id)
        return self.detokenize(sentences, best), counts

    def detokenize(self, sentences: list[str], outputs: list[list[int]]) -> list[str]:
        """The text of each output (token ids) of the line-aligned `sentences`, with its [UNK]s
        replaced by source words when `replace_unk` is on."""
        unk_pieces: list[dict[int, str] | None] = [None] * len(outputs)
        if self.replace_unk:
            unk = self.tgt_codec.unk_id
            needed = [i for i, ids in enumerate(outputs) if unk in ids]
            # Encoded again (cheap, few sentences), as encode_source does, without its warning.
            encoded = {i: self.src_codec.encode_with_pieces(normalize_text(sentences[i]))
                       for i in needed}
            limit = self.decode_cfg.max_input_tokens
            source_ids = [encoded[i][0][:limit] if i in encoded else []
                          for i in range(len(outputs))]
            for chunk in self._batches(source_ids):
                alignments = attended_source_tokens(
                    self.model, [source_ids[i] for i in chunk], [outputs[i] for i in chunk],
                    self.src_codec, self.tgt_codec, self.device)
                for i, alignment in zip(chunk, alignments):
                    unk_pieces[i] = unknown_replacements(outputs[i], alignment, encoded[i][1], unk)
        return [self.tgt_codec.decode(ids, pieces) for ids, pieces in zip(outputs, unk_pieces)]

    def translate_nbest(self, sentences: list[str], nbest: int) -> list[list[tuple[str, float]]]:
        """Up to `nbest` distinct translations per sentence with their length-normalised
        log-probabilities, best first, from a beam of decode.beam_size (at least `nbest`).
        Hypotheses that detokenize to the same text (e.g. two different subword segmentations)
        are listed once, with the better score."""
        results = []
        # All finished beams are asked for, so that duplicates can be replaced by the next ones.
        beam_size = max(self.decode_cfg.beam_size, nbest)
        for sentence, hyps in zip(sentences, self.search(sentences, nbest=beam_size)):
            texts = self.detokenize([sentence] * len(hyps), [h.tokens for h in hyps])
            distinct: dict[str, float] = {}
            for text, h in zip(texts, hyps):
                distinct.setdefault(text, h.score)
            results.append(list(distinct.items())[:nbest])
        return results

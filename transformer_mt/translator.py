"""Translate text with a trained model: normalise, encode, batch by length, search, detokenize."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .batching import source_tensor, src_pad_mask
from .checkpoint import load_checkpoint
from .config import Config, DecodeConfig, config_from_dict
from .data import normalize_text
from .device import pick_device
from .model import Transformer, build_model
from .search import SearchLimits, beam_search, greedy_search
from .tokenizer import TextCodec

log = logging.getLogger(__name__)


class Translator:
    def __init__(self, model: Transformer, src_codec: TextCodec, tgt_codec: TextCodec,
                 decode_cfg: DecodeConfig, device: torch.device):
        self.model = model.to(device).eval()
        self.src_codec, self.tgt_codec = src_codec, tgt_codec
        self.decode_cfg = decode_cfg
        self.device = device
        self.limits = SearchLimits(tgt_codec.sos_id, tgt_codec.eos_id, decode_cfg.max_len_a,
                                   decode_cfg.max_len_b)

    @classmethod
    def from_checkpoint(cls, path: Path, device: str = "auto") -> "Translator":
        state = load_checkpoint(path)
        cfg: Config = config_from_dict(state["config"], str(path))
        src_codec = TextCodec.from_str(state["tokenizers"]["src"])
        tgt_codec = TextCodec.from_str(state["tokenizers"]["tgt"])
        model = build_model(cfg.model, src_codec.vocab_size, tgt_codec.vocab_size)
        model.load_state_dict(state["model"])
        return cls(model, src_codec, tgt_codec, cfg.decode, pick_device(device))

    def _encode(self, sentence: str) -> list[int]:
        ids = self.src_codec.encode(normalize_text(sentence))
        limit = self.decode_cfg.max_input_tokens
        if len(ids) > limit:
            log.warning("input of %d tokens truncated to decode.max_input_tokens=%d: %.40s...",
                        len(ids), limit, sentence)
            ids = ids[:limit]
        return ids

    def translate_ids(self, sentences: list[str], beam_size: int = 1, alpha: float = 0.6,
                      nbest: int = 1) -> list[list[list[int]]]:
        """Up to `nbest` token-id outputs per sentence. Empty input gives one empty output."""
        encoded = [self._encode(s) for s in sentences]
        results: list[list[list[int]]] = [[[]] for _ in sentences]
        # Sort by length so that each batch pads little; outputs go back to input order.
        order = sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: len(encoded[i]))
        size = self.decode_cfg.batch_size
        for start in range(0, len(order), size):
            chunk = order[start:start + size]
            src = source_tensor([encoded[i] for i in chunk], self.src_codec).to(self.device)
            mask = src_pad_mask(src, self.src_codec.pad_id)
            if beam_size == 1 and nbest == 1:
                outputs = [[ids] for ids in greedy_search(self.model, src, mask, self.limits)]
            else:
                hyps = beam_search(self.model, src, mask, self.limits, beam_size, alpha, nbest)
                outputs = [[h.tokens for h in sentence] for sentence in hyps]
            for i, out in zip(chunk, outputs):
                results[i] = out
        return results

    def translate(self, sentences: list[str], beam_size: int = 1, alpha: float = 0.6
                  ) -> list[str]:
        return [self.tgt_codec.decode(outputs[0])
                for outputs in self.translate_ids(sentences, beam_size, alpha)]

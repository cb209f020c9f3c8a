"""Greedy and beam search over a batch of sentences, on the decoder's key/value cache.

The cache holds each decoder layer's self-attention keys/values for the positions decoded so far
and its cross-attention keys/values of the encoder output (computed once per sentence), so a step
costs one position, not the whole prefix. Sentences that finish leave the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .model import Transformer
from .model.masks import causal_mask


@dataclass(frozen=True)
class SearchLimits:
    sos_id: int
    eos_id: int
    max_len_a: float         # output length cap: a * source length + b (decode.max_len_a/b)
    max_len_b: int

    def max_lengths(self, src_mask: torch.Tensor) -> torch.Tensor:
        """Per-sentence cap on output tokens, from the real source length (without SOS/EOS)."""
        src_tokens = src_mask.reshape(src_mask.size(0), -1).sum(dim=1) - 2
        return (self.max_len_a * src_tokens.float() + self.max_len_b).long().clamp(min=1)


def _select_rows(cache: list[dict], rows: torch.Tensor, keys: tuple[str, ...]) -> None:
    for layer in cache:
        for key in keys:
            if key in layer:
                layer[key] = layer[key].index_select(0, rows)


TokenPicker = Callable[[torch.Tensor], torch.Tensor]      # logits (B, vocab) -> ids (B,)


def top_k_sampler(k: int, temperature: float = 1.0,
                  generator: torch.Generator | None = None) -> TokenPicker:
    """Draw each next token from the k most probable ones, with probabilities
    softmax(logits / temperature); a seeded `generator` makes the draws repeatable."""
    def pick(logits: torch.Tensor) -> torch.Tensor:
        top_logits, top_ids = logits.float().topk(min(k, logits.size(-1)), dim=-1)
        probs = (top_logits / temperature).softmax(dim=-1)
        # The generator lives on the CPU, so the draw does too (a few numbers per sentence).
        choice = torch.multinomial(probs.cpu(), 1, generator=generator).to(logits.device)
        return top_ids.gather(1, choice).squeeze(1)
    return pick


@torch.no_grad()
def greedy_search(model: Transformer, src: torch.Tensor, src_mask: torch.Tensor,
                  limits: SearchLimits, use_cache: bool = True,
                  pick_next: TokenPicker | None = None) -> list[list[int]]:
    """Most probable next token at each step (or the one `pick_next` chooses from the logits,
    e.g. a `top_k_sampler`). Returns token ids without [SOS]/[EOS].

    `use_cache=False` re-decodes the whole prefix at every step (the reference method), kept to
    test that the cache changes nothing."""
    batch = src.size(0)
    memory = model.encode(src, src_mask)
    max_lengths = limits.max_lengths(src_mask)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    alive = torch.arange(batch, device=src.device)          # original index of each row
    prefix = torch.full((batch, 1), limits.sos_id, dtype=torch.long, device=src.device)
    cache = model.new_cache(memory) if use_cache else None
    step = 0
    while alive.numel():
        if use_cache:
            hidden = model.decode(prefix[:, -1:], memory, src_mask, None, cache, start=step)
        else:
            hidden = model.decode(prefix, memory, src_mask, causal_mask(prefix.size(1),
                                                                        src.device))
        logits = model.project(hidden[:, -1])
        next_tokens = pick_next(logits) if pick_next else logits.argmax(dim=-1)
        step += 1
        finished = (next_tokens == limits.eos_id) | (max_lengths[alive] <= step)
        for row, token in enumerate(next_tokens.tolist()):
            if token != limits.eos_id:
                outputs[int(alive[row])].append(token)
        prefix = torch.cat([prefix, next_tokens[:, None]], dim=1)
        if finished.any():
            keep = (~finished).nonzero().squeeze(1)
            alive, prefix = alive[keep], prefix[keep]
            memory, src_mask = memory[keep], src_mask[keep]
            if cache is not None:
                _select_rows(cache, keep, ("self_k", "self_v", "cross_k", "cross_v"))
    return outputs


@dataclass
class Hypothesis:
    tokens: list[int]
    score: float             # length-normalised log-probability


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ((5 + length) / 6) ** alpha; alpha = 0 ranks by raw log-probability."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(model: Transformer, src: torch.Tensor, src_mask: torch.Tensor,
                limits: SearchLimits, beam_size: int, alpha: float,
                nbest: int = 1) -> list[list[Hypothesis]]:
    """Batched beam search. For each sentence, up to `nbest` finished hypotheses, best first,
    ranked by log-probability / length_penalty(length, alpha) (decode.length_penalty).

    A hypothesis that emits [EOS] among the top `beam_size` candidates is kept as finished; a
    sentence is done when it has `beam_size` finished hypotheses or reaches its length cap
    (then its open beams count as finished). With beam_size 1 this is exactly greedy search.
    """
    k = beam_size
    batch, device = src.size(0), src.device
    memory = model.encode(src, src_mask)
    max_lengths = limits.max_lengths(src_mask)
    # Decoder row b*k + j is beam j of sentence b; the cache's cross-attention keys/values and
    # src_mask keep one row per sentence, shared by its beams.
    cache = model.new_cache(memory)
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0                                       # all beams start identical
    tokens = torch.full((batch * k, 1), limits.sos_id, dtype=torch.long, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    alive = torch.arange(batch, device=device)
    step = 0
    while alive.numel():
        n = alive.numel()
        hidden = model.decode(tokens[:, -1:], memory, src_mask, None, cache, start=step)
        log_probs = model.project(hidden[:, -1]).float().log_softmax(dim=-1)
        vocab = log_probs.size(-1)
        # In place: one (rows × vocabulary) tensor fewer per step.
        candidates = log_probs.view(n, k, vocab).add_(scores[:, :, None]).view(n, k * vocab)
        top_scores, top_ids = candidates.topk(min(2 * k, k * vocab), dim=1)
        origin, token = top_ids // vocab, top_ids % vocab
        step += 1
        is_eos = token == limits.eos_id
        at_cap = max_lengths[alive] <= step

        # Finished: [EOS] among the best k candidates.
        done = torch.zeros(n, dtype=torch.bool, device=device)
        for row, col in (is_eos[:, :k] & torch.isfinite(top_scores[:, :k])).nonzero().tolist():
            sentence = int(alive[row])
            if len(finished[sentence]) < k:
                prefix = tokens[row * k + int(origin[row, col]), 1:].tolist()
                finished[sentence].append(Hypothesis(
                    prefix, float(top_scores[row, col]) / length_penalty(step, alpha)))
        # Open beams: the best k candidates that are not [EOS].
        rank = torch.where(is_eos, 2 * k, (~is_eos).cumsum(dim=1) - 1)
        chosen = rank.argsort(dim=1, stable=True)[:, :k]
        new_origin = origin.gather(1, chosen)
        new_token = token.gather(1, chosen)
        scores = top_scores.gather(1, chosen)
        rows = (torch.arange(n, device=device)[:, None] * k + new_origin).view(-1)
        tokens = torch.cat([tokens[rows], new_token.view(-1, 1)], dim=1)
        _select_rows(cache, rows, ("self_k", "self_v"))

        for row in range(n):
            sentence = int(alive[row])
            if len(finished[sentence]) >= k:
                done[row] = True
            elif at_cap[row]:
                for j in range(k):
                    if torch.isfinite(scores[row, j]):
                        finished[sentence].append(Hypothesis(
                            tokens[row * k + j, 1:].tolist(),
                            float(scores[row, j]) / length_penalty(step, alpha)))
                done[row] = True
        if done.any():
            keep = (~done).nonzero().squeeze(1)
            keep_rows = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)
            alive, scores = alive[keep], scores[keep]
            tokens, memory, src_mask = tokens[keep_rows], memory[keep], src_mask[keep]
            _select_rows(cache, keep_rows, ("self_k", "self_v"))
            _select_rows(cache, keep, ("cross_k", "cross_v"))
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]

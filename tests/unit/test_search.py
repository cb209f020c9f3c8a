import torch
from conftest import needs_cuda

from transformer_mt.config import ModelConfig
from transformer_mt.model import build_model
from transformer_mt.model.masks import src_pad_mask
from transformer_mt.search import SearchLimits, beam_search, greedy_search

PAD, SOS, EOS = 1, 2, 3


def _setup(seed=0, device="cpu"):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, layers=2, heads=4, d_ff=64, dropout=0.0)
    model = build_model(cfg, 40, 30).eval()
    # Make [EOS] unlikely at first so that outputs have varied, non-trivial lengths.
    with torch.no_grad():
        model.projection.bias[EOS] -= 2.0
    src = torch.randint(4, 40, (6, 9))
    for row, length in enumerate([9, 7, 5, 3, 8, 2]):
        src[row, length:] = PAD
    src[:, 0] = SOS
    src = src.to(device)
    return model.to(device), src, src_pad_mask(src, PAD)


def test_cached_greedy_equals_uncached_greedy(device):
    for seed in range(3):
        model, src, mask = _setup(seed, device)
        limits = SearchLimits(SOS, EOS, max_len_a=1.0, max_len_b=5)
        cached = greedy_search(model, src, mask, limits, use_cache=True)
        uncached = greedy_search(model, src, mask, limits, use_cache=False)
        assert cached == uncached
        assert len({len(o) for o in cached}) > 1       # varied lengths exercise batch shrinking


def test_beam_size_one_is_greedy(device):
    for seed in range(3):
        model, src, mask = _setup(seed, device)
        limits = SearchLimits(SOS, EOS, max_len_a=1.0, max_len_b=5)
        greedy = greedy_search(model, src, mask, limits)
        beam = beam_search(model, src, mask, limits, beam_size=1, alpha=0.0)
        assert [h[0].tokens for h in beam] == greedy


def test_greedy_respects_the_length_cap(device):
    model, src, mask = _setup(device=device)
    limits = SearchLimits(SOS, EOS, max_len_a=0.0, max_len_b=2)
    assert all(len(o) <= 2 for o in greedy_search(model, src, mask, limits))


def test_beam_search_nbest_is_sorted_and_scores_at_least_greedy(device):
    model, src, mask = _setup(device=device)
    limits = SearchLimits(SOS, EOS, max_len_a=1.0, max_len_b=5)
    beams = beam_search(model, src, mask, limits, beam_size=4, alpha=0.0, nbest=3)
    greedy = beam_search(model, src, mask, limits, beam_size=1, alpha=0.0)
    for hyps, best_greedy in zip(beams, greedy):
        assert 1 <= len(hyps) <= 3
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert hyps[0].score >= best_greedy[0].score - 1e-5


def test_single_sentence_gives_same_output_as_in_a_batch(device):
    model, src, mask = _setup(device=device)
    limits = SearchLimits(SOS, EOS, max_len_a=1.0, max_len_b=5)
    batched = greedy_search(model, src, mask, limits)
    for row in range(src.size(0)):
        length = int(mask[row].sum())
        alone = greedy_search(model, src[row:row + 1, :length], mask[row:row + 1, ..., :length],
                              limits)
        assert alone[0] == batched[row]


@needs_cuda
def test_cuda_decodes_as_the_cpu_does():
    """Decoding runs in float32 on every device: the same weights give the same tokens."""
    limits = SearchLimits(SOS, EOS, max_len_a=1.0, max_len_b=5)
    for seed in range(3):
        on = {name: _setup(seed, torch.device(name)) for name in ("cpu", "cuda")}
        assert greedy_search(*on["cuda"], limits) == greedy_search(*on["cpu"], limits)
        beams = {name: beam_search(*args, limits, beam_size=4, alpha=0.6)
                 for name, args in on.items()}
        assert [h[0].tokens for h in beams["cuda"]] == [h[0].tokens for h in beams["cpu"]]

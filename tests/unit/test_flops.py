"""The model's FLOP formula agrees with the matmuls torch actually runs."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from transformer_mt.config import ModelConfig
from transformer_mt.model import build_model
from transformer_mt.model.flops import MatmulProbe, forward_flops, training_flops
from transformer_mt.model.masks import src_pad_mask, tgt_mask


def test_forward_flops_equal_the_counted_matmuls_of_one_pair():
    cfg = ModelConfig(d_model=32, layers=2, heads=4, d_ff=48, attention="explicit", dropout=0.0)
    model = build_model(cfg, 50, 70).eval()
    S, T = 7, 5
    src, tgt = torch.randint(4, 50, (1, S)), torch.randint(4, 70, (1, T))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(src, tgt, src_pad_mask(src, 1), tgt_mask(tgt, 1))
    counted = counter.get_total_flops()
    # The formula counts causal self-attention as the T(T+1)/2 query-key pairs it needs; the
    # model computes the full T x T scores and masks them.
    full_square = cfg.layers * (4 * cfg.d_model * T * T - 2 * cfg.d_model * T * (T + 1))
    formula = forward_flops(cfg, 70, torch.tensor([S]), torch.tensor([T]))
    assert formula + full_square == counted
    assert training_flops(cfg, 70, torch.tensor([S]), torch.tensor([T])) == 3 * formula


def test_matmul_probe_measures_a_positive_rate():
    probe = MatmulProbe(torch.device("cpu"), 64)
    assert probe.gflops != probe.gflops            # nothing sampled yet: nan
    probe.sample(0.01)
    assert probe.gflops > 0


def test_peak_flops_comes_from_the_environment_or_a_probe_that_leaves_the_random_state(
        monkeypatch):
    import pytest

    from transformer_mt.errors import TmtError
    from transformer_mt.model.flops import peak_flops

    monkeypatch.setenv("TMT_PEAK_FLOPS", "1.5e12")
    assert peak_flops(torch.device("cpu")) == (1.5e12, "TMT_PEAK_FLOPS")
    for bad in ("fast", "0"):
        monkeypatch.setenv("TMT_PEAK_FLOPS", bad)
        with pytest.raises(TmtError, match="TMT_PEAK_FLOPS"):
            peak_flops(torch.device("cpu"))
    monkeypatch.delenv("TMT_PEAK_FLOPS")
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    flops, source = peak_flops(torch.device("cpu"))
    assert flops > 0 and "measured" in source
    assert torch.equal(torch.rand(4), expected)       # training's random stream is untouched

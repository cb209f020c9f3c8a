"""The learning rate is a pure function of the updates applied: the Noam schedule that LambdaLR
applied before, value for value, from any point on (so a resume needs no schedule state), and
its optional linear decay to zero over the last train.decay_steps."""

import pytest
import torch

from transformer_mt.config import ConfigError, TrainConfig, config_from_dict
from transformer_mt.train_step import learning_rate, noam_factor


def test_learning_rate_equals_lambdalr_noam_bitwise_at_every_update():
    cfg = TrainConfig(lr=7e-4, warmup_steps=30)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: noam_factor(step + 1, cfg.warmup_steps))
    for updates in range(100):
        assert learning_rate(cfg, updates) == optimizer.param_groups[0]["lr"], updates
        optimizer.step()
        scheduler.step()


def test_the_peak_is_train_lr_at_the_end_of_warmup():
    cfg = TrainConfig(lr=1e-3, warmup_steps=10)
    rates = [learning_rate(cfg, updates) for updates in range(40)]
    assert max(rates) == cfg.lr == rates[9]
    assert rates[:10] == sorted(rates[:10]) and rates[9:] == sorted(rates[9:], reverse=True)


def test_decay_steps_follow_noam_then_fall_linearly_to_zero_at_max_steps():
    noam = TrainConfig(lr=1e-3, warmup_steps=10, max_steps=100)
    decayed = TrainConfig(lr=1e-3, warmup_steps=10, max_steps=100, decay_steps=20)
    # Unchanged before the last 20 updates: a run resumed there with the decay is the same run.
    for updates in range(80):
        assert learning_rate(decayed, updates) == learning_rate(noam, updates), updates
    for updates in range(80, 100):
        expected = learning_rate(noam, updates) * (100 - updates) / 20
        assert learning_rate(decayed, updates) == pytest.approx(expected, rel=1e-12), updates
    last = learning_rate(decayed, 99)
    assert 0 < last == pytest.approx(learning_rate(noam, 99) / 20)
    assert learning_rate(decayed, 100) == 0.0
    rates = [learning_rate(decayed, u) for u in range(10, 100)]
    assert rates == sorted(rates, reverse=True)


def test_decay_steps_without_max_steps_is_one_clear_config_error():
    with pytest.raises(ConfigError, match="train.decay_steps .* needs train.max_steps"):
        config_from_dict({"data": {"source": "tsv", "path": "x.tsv"},
                          "train": {"decay_steps": 100}})

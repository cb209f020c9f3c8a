"""The learning rate is a pure function of the updates applied: the Noam schedule that LambdaLR
applied before, value for value, from any point on (so a resume needs no schedule state)."""

import torch

from transformer_mt.config import TrainConfig
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

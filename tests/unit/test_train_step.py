"""The learning rate is a pure function of the updates applied: the Noam schedule that LambdaLR
applied before, value for value, from any point on (so a resume needs no schedule state), and
its optional linear decay to zero over the last train.decay_steps."""

import pytest
import torch
from conftest import needs_cuda

from transformer_mt.batching import Batch
from transformer_mt.config import ConfigError, TrainConfig, config_from_dict
from transformer_mt.model import build_model
from transformer_mt.model.masks import pad_sequences, src_pad_mask, tgt_mask
from transformer_mt.train_step import TrainStep, learning_rate, noam_factor


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


def _step_setup(device):
    cfg = config_from_dict({"data": {"source": "tsv", "path": "x.tsv"},
                            "model": {"d_model": 32, "layers": 1, "heads": 2, "d_ff": 64,
                                      "dropout": 0.0},
                            "train": {"lr": 3e-3, "warmup_steps": 5}})
    torch.manual_seed(0)
    model = build_model(cfg.model, 40, 40).to(device)
    targets = [list(range(4 + i, 11 + i)) for i in range(6)]
    src = pad_sequences([t[::-1] for t in targets], 1, first=2, last=3)
    tgt_in, tgt_out = pad_sequences(targets, 1, first=2), pad_sequences(targets, 1, last=3)
    batch = Batch(src, tgt_in, tgt_out, src_pad_mask(src, 1), tgt_mask(tgt_in, 1),
                  n_tokens=int((tgt_out != 1).sum()))
    return TrainStep(cfg, model, device, pad_id=1), batch


def test_training_steps_learn_a_batch(device):
    """The whole step on each device (bf16 autocast, fused loss and fused Adam on CUDA)."""
    step, batch = _step_setup(device)
    results = [step([batch], updates) for updates in range(60)]
    assert all(r.applied for r in results)
    assert results[-1].loss < 0.25 * results[0].loss


@needs_cuda
def test_a_cuda_step_equals_a_cpu_step_to_bf16_precision():
    (cpu_step, batch), (cuda_step, _) = _step_setup(torch.device("cpu")), _step_setup(torch.device("cuda"))
    cpu, cuda = cpu_step([batch], 0), cuda_step([batch], 0)
    assert cuda.loss == pytest.approx(cpu.loss, rel=1e-2)
    assert cuda.grad_norm == pytest.approx(cpu.grad_norm, rel=5e-2)
    # Adam's first update moves every weight by about the rate, whatever the gradient's size:
    # where bf16 flips the sign of a tiny gradient, the two weights end 2 rates apart.
    bound = 2 * learning_rate(cpu_step.cfg.train, 0) + 1e-6
    for (name, p_cpu), p_cuda in zip(cpu_step.model.named_parameters(),
                                     cuda_step.model.parameters()):
        torch.testing.assert_close(p_cuda.cpu(), p_cpu, rtol=0, atol=bound, msg=name)


@needs_cuda
def test_on_cuda_attention_needs_no_per_shape_plans():
    from transformer_mt.device import pick_device

    torch.backends.cuda.enable_cudnn_sdp(True)
    assert pick_device("auto").type == "cuda"
    assert not torch.backends.cuda.cudnn_sdp_enabled()

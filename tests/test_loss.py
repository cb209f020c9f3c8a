import pytest
import torch
import torch.nn.functional as F

from transformer_mt import loss
from transformer_mt.loss import projected_label_smoothed_loss
from transformer_mt.train_step import label_smoothed_loss


def _inputs(bias=True):
    torch.manual_seed(0)
    hidden = torch.randn(30, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    b = torch.randn(50, requires_grad=True) if bias else None
    return hidden, weight, b, torch.randint(0, 50, (30,))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_fused_loss_equals_cross_entropy_of_the_logits_with_gradients(monkeypatch, bias,
                                                                      smoothing):
    monkeypatch.setattr(loss, "CHUNK_TOKENS", 7)           # several chunks and a partial one
    hidden, weight, b, labels = _inputs(bias)
    inputs = [t for t in (hidden, weight, b) if t is not None]
    logits = hidden @ weight.t() + (b if bias else 0)
    expected = F.cross_entropy(logits, labels, label_smoothing=smoothing, reduction="sum")
    expected_grads = torch.autograd.grad(3 * expected, inputs)
    fused = projected_label_smoothed_loss(hidden, weight, b, labels, smoothing)
    grads = torch.autograd.grad(3 * fused, inputs)
    assert torch.allclose(fused, expected, rtol=1e-5)
    for got, want in zip(grads, expected_grads):
        assert torch.allclose(got, want, atol=1e-4)


def test_fused_loss_without_grad_mode_gives_the_same_value():
    hidden, weight, b, labels = _inputs()
    with_grad = projected_label_smoothed_loss(hidden, weight, b, labels, 0.1)
    with torch.no_grad():
        without = projected_label_smoothed_loss(hidden, weight, b, labels, 0.1)
    assert torch.allclose(with_grad, without) and not without.requires_grad


def test_padding_positions_do_not_count():
    torch.manual_seed(0)
    projection = torch.nn.Linear(8, 20)
    hidden = torch.randn(2, 5, 8)
    labels = torch.tensor([[4, 5, 6, 1, 1], [7, 8, 9, 10, 11]])       # 1 = padding
    before = label_smoothed_loss(hidden, labels, projection, pad_id=1, smoothing=0.1)
    hidden[0, 3:] = 100.0
    after = label_smoothed_loss(hidden, labels, projection, pad_id=1, smoothing=0.1)
    real = labels != 1
    expected = F.cross_entropy(projection(hidden[real]), labels[real], label_smoothing=0.1,
                               reduction="sum")
    assert torch.allclose(before, after) and torch.allclose(after, expected, rtol=1e-5)

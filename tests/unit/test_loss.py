import pytest
import torch
import torch.nn.functional as F
from conftest import needs_cuda

from transformer_mt import loss
from transformer_mt.batching import Batch
from transformer_mt.config import ModelConfig
from transformer_mt.loss import BatchLoss, label_smoothed_loss, projected_label_smoothed_loss
from transformer_mt.model import build_model
from transformer_mt.model.masks import pad_sequences, src_pad_mask, tgt_mask


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


def _model_and_batch(pad=1, sos=2, eos=3):
    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=16, layers=1, heads=2, d_ff=32, dropout=0.0), 30, 40)
    src = pad_sequences([[5, 6, 7], [8, 9]], pad, first=sos, last=eos)
    targets = [[10, 11, 12, 13], [14]]
    tgt_in = pad_sequences(targets, pad, first=sos)
    tgt_out = pad_sequences(targets, pad, last=eos)
    return model, Batch(src, tgt_in, tgt_out, src_pad_mask(src, pad), tgt_mask(tgt_in, pad),
                        n_tokens=int((tgt_out != pad).sum()))


def test_model_loss_is_the_smoothed_cross_entropy_of_its_logits_on_real_target_tokens():
    model, batch = _model_and_batch()
    real = batch.tgt_out != 1
    logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
    expected = F.cross_entropy(logits[real], batch.tgt_out[real], label_smoothing=0.1,
                               reduction="sum")
    expected_grads = torch.autograd.grad(expected, list(model.parameters()))
    got = model.loss(batch, pad_id=1, smoothing=0.1)
    grads = torch.autograd.grad(got, list(model.parameters()))
    assert real.sum() == batch.n_tokens < real.numel()          # the batch has padding
    assert torch.allclose(got, expected, rtol=1e-5)
    for got_grad, want in zip(grads, expected_grads):
        assert torch.allclose(got_grad, want, atol=1e-5)


def test_the_training_module_computes_the_model_loss():
    model, batch = _model_and_batch()
    assert torch.equal(BatchLoss(model)(batch, 1, 0.1), model.loss(batch, 1, 0.1))


@needs_cuda
@pytest.mark.parametrize("bias", [True, False])
def test_fused_loss_under_cuda_autocast_is_the_cross_entropy_to_bf16_precision(monkeypatch, bias):
    """As training runs it on a GPU: bf16 products, float32 softmax, sums and gradients."""
    monkeypatch.setattr(loss, "CHUNK_TOKENS", 96)          # several chunks and a partial one
    torch.manual_seed(0)
    hidden = torch.randn(300, 64, device="cuda", requires_grad=True)
    weight = (torch.randn(500, 64, device="cuda") / 8).requires_grad_()
    b = torch.randn(500, device="cuda", requires_grad=True) if bias else None
    labels = torch.randint(0, 500, (300,), device="cuda")
    inputs = [t for t in (hidden, weight, b) if t is not None]
    logits = hidden @ weight.t() + (b if bias else 0)
    expected = F.cross_entropy(logits, labels, label_smoothing=0.1, reduction="sum")
    expected_grads = torch.autograd.grad(expected, inputs)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fused = projected_label_smoothed_loss(hidden, weight, b, labels, 0.1)
    grads = torch.autograd.grad(fused, inputs)
    assert fused.dtype == torch.float32
    assert torch.allclose(fused, expected, rtol=1e-2)
    for got, want in zip(grads, expected_grads):
        assert got.dtype == want.dtype == torch.float32
        assert (got - want).norm() < 2e-2 * want.norm()

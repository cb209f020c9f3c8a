import dataclasses

import pytest
import torch

from transformer_mt.config import ModelConfig
from transformer_mt.device import autocast
from transformer_mt.model import build_model
from transformer_mt.model.attention import MultiHeadAttention
from transformer_mt.model.dropout import Dropout, ReluDropout
from transformer_mt.model.embeddings import PositionalEncoding
from transformer_mt.model.masks import src_pad_mask, tgt_mask

PAD = 1
SMALL = ModelConfig(d_model=32, layers=2, heads=4, d_ff=64, dropout=0.0)


def _model(**changes):
    torch.manual_seed(0)
    return build_model(dataclasses.replace(SMALL, **changes), 50, 60).eval()


def _batch():
    torch.manual_seed(1)
    src = torch.randint(4, 50, (3, 7))
    tgt = torch.randint(4, 60, (3, 6))
    src[0, 5:] = PAD
    src[2, 3:] = PAD
    tgt[1, 4:] = PAD
    return src, tgt


def test_output_shape():
    src, tgt = _batch()
    logits = _model()(src, tgt, src_pad_mask(src, PAD), tgt_mask(tgt, PAD))
    assert logits.shape == (3, 6, 60)


# How far outputs may move when only masked content changes: none, up to float rounding (on
# CUDA the model runs under bf16 autocast, as in training). An unmasked change moves them by
# far more (test_masks_matter_at_all).
TOLERANCE = {"cpu": 1e-5, "cuda": 1e-3}


def _forward(model, src, tgt, src_mask, tgt_mask, device):
    """The model's logits on `device`, under the autocast that training uses there."""
    with autocast(device):
        return model.to(device)(src.to(device), tgt.to(device), src_mask.to(device),
                                tgt_mask.to(device)).float().cpu()


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_no_position_attends_to_source_padding(norm, device):
    model = _model(norm=norm)
    src, tgt = _batch()
    masks = src_pad_mask(src, PAD), tgt_mask(tgt, PAD)
    before = _forward(model, src, tgt, *masks, device)
    perturbed = src.clone()
    perturbed[src == PAD] = 7          # change what sits under the padding mask
    after = _forward(model, perturbed, tgt, *masks, device)
    assert torch.allclose(before, after, atol=TOLERANCE[device.type])


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_no_position_attends_to_the_future(norm, device):
    model = _model(norm=norm)
    src, tgt = _batch()
    masks = src_pad_mask(src, PAD), tgt_mask(tgt, PAD)
    before = _forward(model, src, tgt, *masks, device)
    for t in range(tgt.size(1)):
        changed = tgt.clone()
        changed[:, t:] = torch.randint(4, 60, changed[:, t:].shape)
        after = _forward(model, src, changed, *masks, device)
        assert torch.allclose(before[:, :t], after[:, :t], atol=TOLERANCE[device.type]), \
            f"position < {t}"


def test_masks_matter_at_all(device):
    # Guards the two tests above against a model that ignores its input.
    model = _model()
    src, tgt = _batch()
    changed = tgt.clone()
    changed[:, 0] = 5
    masks = src_pad_mask(src, PAD), tgt_mask(tgt, PAD)
    a = _forward(model, src, tgt, *masks, device)
    b = _forward(model, src, changed, *masks, device)
    assert (a[:, 1:] - b[:, 1:]).abs().max() > 100 * TOLERANCE[device.type]


def test_sdpa_equals_explicit_attention_with_masks(device):
    torch.manual_seed(0)
    attention = MultiHeadAttention(32, 4, dropout=0.0).eval().to(device)
    x, memory = torch.randn(3, 6, 32, device=device), torch.randn(3, 7, 32, device=device)
    src, tgt = _batch()
    for query, keys, mask in ((x, memory, src_pad_mask(src, PAD)), (x, x, tgt_mask(tgt, PAD))):
        attention.implementation = "sdpa"
        fused = attention(query, keys, mask.to(device))
        attention.implementation = "explicit"
        explicit = attention(query, keys, mask.to(device))
        assert torch.allclose(fused, explicit, atol=1e-5)


def test_whole_model_sdpa_equals_explicit(device):
    src, tgt = _batch()
    args = (src, tgt, src_pad_mask(src, PAD), tgt_mask(tgt, PAD), device)
    # bf16 rounding differs between the fused kernel and the explicit products on CUDA.
    atol = 1e-4 if device.type == "cpu" else 5e-2
    assert torch.allclose(_forward(_model(attention="sdpa"), *args),
                          _forward(_model(attention="explicit"), *args), atol=atol)


def test_keys_queries_and_values_have_their_own_projections():
    attention = MultiHeadAttention(32, 4, dropout=0.0)
    weights = [attention.w_q.weight, attention.w_k.weight, attention.w_v.weight,
               attention.w_o.weight]
    assert len({w.data_ptr() for w in weights}) == 4


def test_every_block_owns_its_feed_forward_and_norms_have_vector_parameters():
    model = _model()
    ffns = [b.feed_forward for b in [*model.encoder.blocks, *model.decoder.blocks]]
    assert len({id(f) for f in ffns}) == len(ffns)
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            assert module.weight.shape == (32,) and module.bias.shape == (32,)


def test_tied_embeddings_share_one_matrix():
    model = _model(tie_embeddings=True)
    assert model.projection.weight is model.tgt_embed.embedding.weight
    untied = _model()
    assert sum(p.numel() for p in untied.parameters()) - sum(
        p.numel() for p in model.parameters()) == 60 * 32


def test_positional_encoding_has_no_length_cap():
    pe = PositionalEncoding(16, dropout=0.0, initial_length=8)
    out = pe(torch.zeros(1, 5000, 16))
    assert out.shape == (1, 5000, 16)
    assert torch.allclose(pe(torch.zeros(1, 3, 16), start=4997), out[:, 4997:])


def test_embeddings_are_scaled_by_sqrt_d_model():
    model = _model()
    ids = torch.tensor([[5]])
    expected = model.src_embed.embedding.weight[5] * (32 ** 0.5)
    assert torch.allclose(model.src_embed(ids)[0, 0], expected)


def test_joint_vocabulary_ties_source_target_and_output_embeddings():
    cfg = dataclasses.replace(SMALL, tie_embeddings=True)
    model = build_model(cfg, 50, 50, joint_vocab=True)
    assert model.src_embed.embedding.weight is model.tgt_embed.embedding.weight
    assert model.projection.weight is model.tgt_embed.embedding.weight
    separate = build_model(cfg, 50, 50)
    assert sum(p.numel() for p in separate.parameters()) - sum(
        p.numel() for p in model.parameters()) == 50 * 32


def test_dropout_drops_at_rate_p_keeps_the_mean_and_follows_the_seed():
    dropout = Dropout(0.1).train()
    x = torch.ones(1000, 257)                 # not a multiple of the 4 draws per random word
    torch.manual_seed(3)
    out = dropout(x)
    assert abs((out == 0).float().mean().item() - 0.1) < 0.005
    assert abs(out.mean().item() - 1.0) < 0.01
    torch.manual_seed(3)
    assert torch.equal(dropout(x), out)
    assert torch.equal(dropout.eval()(x), x)


@pytest.mark.parametrize("fused", [Dropout, ReluDropout])
def test_cpu_dropout_gradient_flows_exactly_through_the_kept_elements(fused):
    torch.manual_seed(0)
    x = torch.randn(64, 33, requires_grad=True)
    out = fused(0.25).train()(x)
    kept = out != 0
    reference = torch.relu(x) if fused is ReluDropout else x
    scale = out[kept] / reference[kept]
    assert torch.allclose(scale, torch.full_like(scale, 1 / 0.75), rtol=1e-4)
    grad = torch.randn_like(out)
    out.backward(grad)
    assert torch.allclose(x.grad, torch.where(kept, grad * scale.mean(), 0.0))


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_recomputed_activations_give_the_same_loss_and_gradients_with_dropout(norm, device):
    """train.recompute trades memory for compute only: dropout masks are replayed in the
    backward pass, so the gradients are those of the ordinary backward pass."""
    src, tgt = (t.to(device) for t in _batch())
    masks = src_pad_mask(src, PAD), tgt_mask(tgt, PAD)
    results = []
    for recompute in (False, True):
        model = _model(dropout=0.3, norm=norm).train().to(device)
        model.set_recompute(recompute)
        torch.manual_seed(7)
        with autocast(device):
            loss = model(src, tgt, *masks).float().logsumexp(-1).mean()
        loss.backward()
        after = torch.rand(1, device=device)     # the random stream continues as without recompute
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}, after))
    (loss_a, grads_a, after_a), (loss_b, grads_b, after_b) = results
    assert torch.equal(loss_a, loss_b) and torch.equal(after_a, after_b)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-5, atol=1e-6, msg=name)

"""The chunked LM-head cross-entropy against the plain formula: loss and both gradients, fp32 and bf16 autocast."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import resnorm_lm.model.loss as loss_module
from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.loss import linear_cross_entropy
from resnorm_lm.targets import IGNORE_INDEX


def plain(h, w, t, reduction, bf16=False):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = F.linear(h, w).float()  # (N, V)
    return F.cross_entropy(logits, t, ignore_index=IGNORE_INDEX, reduction=reduction)


def loss_and_grads(fn, h, w, t, reduction, **kw):
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss = fn(h, w, t, reduction, **kw)
    loss.backward()
    return [loss.detach(), h.grad, w.grad]


def fused(h, w, t, reduction, bf16=False):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return linear_cross_entropy(h, w, t, reduction)


def inputs(n=203, c=24, v=157, ignored=17, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(n, c, generator=gen, dtype=dtype)  # (N, C)
    w = torch.randn(v, c, generator=gen, dtype=dtype) * 0.5  # (V, C)
    t = torch.randint(0, v, (n,), generator=gen)  # (N,)
    t[torch.randperm(n, generator=gen)[:ignored]] = IGNORE_INDEX
    return h, w, t


@pytest.fixture(params=[1, 7, 64, 10_000], ids=lambda r: f"rows{r}")
def chunk_rows(request, monkeypatch):
    """Chunks of one row, of an awkward count, of many, and one chunk for all."""
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", request.param * 157)
    return request.param


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fp32_matches_the_plain_formula_within_its_own_error(chunk_rows, reduction):
    h, w, t = inputs()
    exact = loss_and_grads(plain, h.double(), w.double(), t, reduction)  # fp64 reference
    ref = loss_and_grads(plain, h, w, t, reduction)
    got = loss_and_grads(fused, h, w, t, reduction)
    for g, r, e in zip(got, ref, exact):
        assert g.dtype == r.dtype
        own_error = (r.double() - e).abs().max().item()
        scale = e.abs().max().item()
        # the error of the fp32 plain path against fp64 sets the scale; summation order may differ by a few ulps
        assert (g.double() - e).abs().max().item() <= 4 * own_error + 8 * torch.finfo(torch.float32).eps * scale


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_bf16_autocast_matches_the_plain_formula_within_bf16(chunk_rows, reduction):
    h, w, t = inputs()
    exact = loss_and_grads(plain, h.double(), w.double(), t, reduction)
    ref = loss_and_grads(plain, h, w, t, reduction, bf16=True)
    got = loss_and_grads(fused, h, w, t, reduction, bf16=True)
    for g, r, e in zip(got, ref, exact):
        assert g.dtype == r.dtype == torch.float32
        scale = e.abs().max().item()
        own_error = (r.double() - e).abs().max().item()
        assert own_error > 0  # the plain path's bf16 error is real: the check below measures against it
        assert (g.double() - e).abs().max().item() <= 2 * own_error + 1e-6 * scale


def test_ignored_targets_get_no_gradient_and_are_not_counted():
    h, w, t = inputs()
    got = loss_and_grads(fused, h, w, t, "mean")
    assert torch.all(got[1][t == IGNORE_INDEX] == 0)
    kept = t != IGNORE_INDEX
    only_counted = loss_and_grads(plain, h[kept], w, t[kept], "mean")
    torch.testing.assert_close(got[0], only_counted[0])


def test_every_target_ignored_gives_the_plain_formulas_answer():
    h, w, t = inputs(n=5, ignored=5)
    assert torch.isnan(plain(h, w, t, "mean")) and torch.isnan(fused(h, w, t, "mean"))
    assert fused(h, w, t, "sum").item() == plain(h, w, t, "sum").item() == 0.0


def test_the_incoming_gradient_scales_both_gradients():
    h, w, t = inputs()
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    (3.0 * linear_cross_entropy(hh, ww, t)).backward()
    ref = loss_and_grads(fused, h, w, t, "mean")
    torch.testing.assert_close(hh.grad, 3.0 * ref[1])
    torch.testing.assert_close(ww.grad, 3.0 * ref[2])


def test_no_gradient_is_formed_where_none_is_needed(monkeypatch):
    h, w, t = inputs()
    formed = []
    chunked = loss_module._chunked
    monkeypatch.setattr(loss_module, "_chunked", lambda *a: formed.append(chunked(*a)[1:]) or chunked(*a))
    with torch.no_grad():  # evaluation: the loss only
        linear_cross_entropy(h.requires_grad_(), w, t)
    linear_cross_entropy(h, w.requires_grad_(False), t)  # a frozen head: the gradient of h only
    assert formed[0] == (None, None)
    assert formed[1][0].shape == h.shape and formed[1][1] is None


def test_unknown_reduction_is_refused():
    h, w, t = inputs()
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum'"):
        linear_cross_entropy(h, w, t, "none")


@pytest.mark.parametrize("tie", [True, False])
def test_gpt_loss_and_gradients_equal_the_logits_path(tie):
    """The model's loss (tied or untied head) against cross-entropy of the logits it returns without targets."""
    cfg = GPTConfig(vocab_size=101, block_size=16, n_layer=2, n_head=2, n_embd=32, tie_embeddings=tie)
    torch.manual_seed(0)
    model = GPT(cfg)
    idx, tgt = torch.randint(0, 101, (3, 11)), torch.randint(0, 101, (3, 11))
    logits, none = model(idx)
    assert none is None and logits.shape == (3, 11, 101)
    ref = F.cross_entropy(logits.flatten(0, 1), tgt.flatten())
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    no_logits, loss = model(idx, tgt)
    assert no_logits is None
    torch.testing.assert_close(loss, ref)
    for g, r in zip(torch.autograd.grad(loss, list(model.parameters())), ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    summed = model(idx, tgt, reduction="sum")[1]
    torch.testing.assert_close(summed, ref * tgt.numel())


def test_compiled_model_uses_the_plain_formula_and_agrees(fresh_dynamo):
    cfg = GPTConfig(vocab_size=101, block_size=16, n_layer=1, n_head=2, n_embd=32)
    torch.manual_seed(0)
    model = GPT(cfg)
    idx, tgt = torch.randint(0, 101, (2, 9)), torch.randint(0, 101, (2, 9))
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(idx, tgt)[1], model(idx, tgt)[1])

"""Norms: the worked examples, parity with plain references, the Add & Norm primitive, the registry."""

import copy
import math

import pytest
import torch

from resnorm_lm.model.norms import NORMS, LayerNorm, build_norm
from tests import reference_norms as ref
from tests.tolerances import assert_within_noise

# ---------------------------------------------------------------- worked examples (REFERENCES.md)


def test_worked_example_large_values():
    """x = [1000, 1500, ..., 3000]: mean 2000, population std 707.1."""
    y = LayerNorm(5)(torch.tensor([[1000.0, 1500.0, 2000.0, 2500.0, 3000.0]]))
    torch.testing.assert_close(y, torch.tensor([[-1.4142, -0.7071, 0.0, 0.7071, 1.4142]]), atol=1e-4, rtol=0)


def test_worked_example_small_values_with_affine():
    """x = [0.8, -1.2, 0.5, 2.1, -0.3]: mean 0.38, population std 1.1053 (not the sample std 1.2357, nor the 1.18
    a tutorial quotes: its [0.36, -1.34, 0.10, 1.46, -0.58] is off by more than the tolerance here)."""
    x = torch.tensor([[0.8, -1.2, 0.5, 2.1, -0.3]])
    norm = LayerNorm(5)
    torch.testing.assert_close(norm(x), torch.tensor([[0.380, -1.430, 0.109, 1.556, -0.615]]), atol=1e-3, rtol=0)
    with torch.no_grad():
        norm.weight.fill_(1.5)
        norm.bias.fill_(0.1)
    torch.testing.assert_close(norm(x), torch.tensor([[0.670, -2.044, 0.263, 2.434, -0.823]]), atol=1e-3, rtol=0)


def test_layernorm_output_is_standardized_not_squashed_to_unit_interval():
    x = torch.randn(64, 256) * 30 + 7
    y = LayerNorm(256)(x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(64), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(64), atol=1e-3, rtol=0)
    assert y.min() < -1 and y.max() > 1


def test_eps_sits_inside_the_square_root():
    x = torch.tensor([[0.0, 0.02]])  # var = 1e-4
    eps = 1e-2
    y = LayerNorm(2, eps=eps)(x)
    assert y[0, 1].item() == pytest.approx(0.01 / math.sqrt(1e-4 + eps), rel=1e-5)
    assert y[0, 1].item() != pytest.approx(0.01 / (0.01 + eps), rel=1e-3)  # the (std + eps) form


# ---------------------------------------------------------------- parity with plain references


def randomize_parameters(norm):
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(torch.randn_like(p) * 0.3)


SHAPES = [(3, 7, 1000), (5, 64), (1, 1, 33), (13, 96)]


def noisy_module(name, dim, bias, dtype):
    """A norm with random parameters in ``dtype``, its exact fp64 twin and its fp32 twin (the plain path)."""
    norm = build_norm(name, dim, bias=bias)
    randomize_parameters(norm)
    norm = norm.to(dtype)
    exact = ref.fp64_twin(norm, name, dim, bias)
    return norm, exact, copy.deepcopy(exact).float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("name", NORMS.names())
def test_norm_forward_matches_reference(name, shape, bias, dtype):
    norm, exact, plain = noisy_module(name, shape[-1], bias, dtype)
    x = (torch.randn(shape) * 2 + 0.5).to(dtype)
    y = norm(x)
    assert y.dtype == dtype and y.shape == x.shape
    # the noise floor: the formula with fp32 arithmetic (as torch computes half-precision norms), rounded to dtype
    path = ref.reference(plain, x, torch.float32).to(dtype)
    assert_within_noise(y, path, ref.reference(exact, x), f"{name} ({dtype})")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", NORMS.names())
def test_norm_gradients_match_reference(name, shape, dtype):
    norm, norm64, plain = noisy_module(name, shape[-1], True, dtype)
    x = (torch.randn(shape) * 2 + 0.5).to(dtype).requires_grad_()
    dy = torch.randn(shape).to(dtype)
    x64, x32 = x.detach().double().requires_grad_(), x.detach().float().requires_grad_()  # the same rounded input
    got = torch.autograd.grad(norm(x), [x, *norm.parameters()], grad_outputs=dy)
    want = torch.autograd.grad(ref.reference(norm64, x64), [x64, *norm64.parameters()], grad_outputs=dy.double())
    path = torch.autograd.grad(
        ref.reference(plain, x32, torch.float32), [x32, *plain.parameters()], grad_outputs=dy.float()
    )
    names = ["x"] + [n for n, _ in norm.named_parameters()]
    for what, g, w, p in zip(names, got, want, path):
        # floor 1: a parameter gradient sums random-sign terms and can cancel to near zero
        # a parameter's gradient sums over every row (and a scalar gain over every element too)
        terms = 1 if what == "x" else x.numel() // w.numel()
        assert_within_noise(g, p.to(dtype), w, f"{name} d{what} ({dtype})", floor=1.0, terms=terms)


@pytest.mark.parametrize("name", NORMS.names())
def test_constant_rows_give_no_nan(name):
    norm = build_norm(name, 64)
    for value in (0.0, 3.0, -1e4):
        x = torch.full((4, 64), value, requires_grad=True)
        y = norm(x)
        y.sum().backward()
        assert torch.isfinite(y).all(), f"{name} on a constant row {value}"
        assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", NORMS.names())
def test_add_norm_returns_the_sum_then_its_norm(name):
    norm = build_norm(name, 48)
    randomize_parameters(norm)
    x, d = torch.randn(2, 5, 48), torch.randn(2, 5, 48)
    s, y = norm.add_norm(x, d)  # x = x + d;  h = norm(x)
    torch.testing.assert_close(s, x + d)
    torch.testing.assert_close(y, norm(x + d))


# ---------------------------------------------------------------- parameter semantics and registry


def test_parameters_match_torch_semantics_and_the_papers_inits():
    """Parameters as torch.nn.LayerNorm and torch.nn.RMSNorm name and initialize them, no bias where bias=False;
    ScaleNorm's gain starts at sqrt(d), DyT's alpha at 0.5 (their papers). The outputs are the parity tests'."""
    for name, torch_norm in (("layernorm", torch.nn.LayerNorm(16)), ("rmsnorm", torch.nn.RMSNorm(16))):
        ours = dict(build_norm(name, 16).named_parameters())
        assert ours.keys() == dict(torch_norm.named_parameters()).keys(), name
        for key, p in torch_norm.named_parameters():
            torch.testing.assert_close(ours[key], p)
    assert "bias" not in dict(build_norm("layernorm", 16, bias=False).named_parameters())
    assert "bias" not in dict(build_norm("dyt", 16, bias=False).named_parameters())
    assert build_norm("scalenorm", 16).gain.item() == pytest.approx(4.0)
    assert build_norm("dyt", 16).alpha.item() == pytest.approx(0.5)
    assert list(build_norm("none", 16).parameters()) == []


def test_dyt_and_derf_start_as_their_authors_set_up_language_models():
    """DyT's LLaMA setup (jiachenzhu/DyT): alpha by width and by what the norm feeds, no bias, the embeddings
    scaled by a learned sqrt(d); Derf's GPT-2 patch (zlab-princeton/Derf): alpha 1, shift 0, the token + position
    embeddings scaled by a learned sqrt(d)."""
    alphas = {
        (width, role): build_norm("dyt_paper", width, role=role).alpha.item()
        for width in (128, 1024, 4096, 8192)
        for role in ("attention", "mlp", "final")
    }
    assert [alphas[128, r] for r in ("attention", "mlp", "final")] == [1.0, 1.0, 1.0]
    assert [alphas[4096, r] for r in ("attention", "mlp", "final")] == pytest.approx([0.8, 0.2, 0.2])
    assert [alphas[8192, r] for r in ("attention", "mlp", "final")] == pytest.approx([0.2, 0.05, 0.05])
    assert "bias" not in dict(build_norm("dyt_paper", 16, role="mlp").named_parameters())
    derf = build_norm("derf", 16)
    assert (derf.alpha.item(), derf.shift.item(), derf.bias.abs().sum().item()) == (1.0, 0.0, 0.0)
    for name in ("dyt_paper", "derf"):
        scale = NORMS.get(name).input_scale(16)
        assert scale.gain.item() == pytest.approx(4.0) and scale.gain.requires_grad


def test_the_rms_readout_arm_sets_its_alpha_to_one_over_the_rms_of_its_input():
    """dyt_rms_readout's final norm: gamma * tanh(x / RMS(x)), the same output whatever the input's scale (it
    cannot saturate as the stream grows); its other norms are dyt_paper's."""
    final = build_norm("dyt_rms_readout", 16, role="final")
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        final.weight.uniform_(0.5, 1.5)
    torch.testing.assert_close(final.double()(x), ref.reference(final.double(), x))
    torch.testing.assert_close(final.double()(100 * x), final.double()(x))
    assert type(build_norm("dyt_rms_readout", 16, role="mlp")) is NORMS.get("dyt_rms_readout")


def test_the_unscaled_arm_is_dyt_paper_without_the_embedding_scale():
    """dyt_paper_unscaled: the paper's alphas and no bias, and nothing on the embeddings (the stream starts at the
    init's RMS)."""
    for role in ("attention", "mlp", "final"):
        arm, paper = build_norm("dyt_paper_unscaled", 16, role=role), build_norm("dyt_paper", 16, role=role)
        assert arm.alpha.item() == paper.alpha.item() and arm.bias is None
    assert isinstance(NORMS.get("dyt_paper_unscaled").input_scale(16), torch.nn.Identity)
    assert not isinstance(NORMS.get("dyt_paper").input_scale(16), torch.nn.Identity)


def test_unknown_norm_lists_valid_names():
    with pytest.raises(
        ValueError,
        match="unknown norm 'batchnorm'.*derf, dyt, dyt_llm, dyt_lnout, dyt_paper, dyt_paper_unscaled, "
        "dyt_rms_readout, layernorm, none",
    ):
        build_norm("batchnorm", 8)


def test_unknown_backend_lists_valid_names():
    with pytest.raises(ValueError, match="unknown norm backend 'cuda'.*torch, triton"):
        build_norm("layernorm", 8, backend="cuda")


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="dimension must be >= 1"):
        build_norm("layernorm", 0)
    with pytest.raises(ValueError, match="eps must be > 0"):
        build_norm("rmsnorm", 8, eps=0.0)

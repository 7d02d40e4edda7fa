"""Each placement against its formula (from the paper its docstring cites) on toy sublayers."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.norms import LayerNorm, Norm
from resnorm_lm.model.placements import PLACEMENTS, BlockContext, DeepNorm, ResiDualReadout

C = 16


def make_placement(name, layer=0, n_layer=4):
    def make_norm(role=None):
        norm = LayerNorm(C)
        with torch.no_grad():  # non-trivial affine parameters so the test sees which norm is used where
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
        return norm

    return PLACEMENTS.get(name)(BlockContext(layer, n_layer, make_norm))


class Toy(nn.Module):
    """A deterministic nonlinear sublayer standing in for attention or the MLP."""

    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(C, C, generator=g) / math.sqrt(C))

    def forward(self, x):
        return torch.tanh(x @ self.w) * 2.0


def ln(norm, x):
    return F.layer_norm(x, (C,), norm.weight, norm.bias, norm.eps)


@pytest.fixture
def toys():
    return Toy(1), Toy(2)


@pytest.fixture
def x():
    return torch.randn(2, 3, C) * 3


def test_postnorm(toys, x):
    p = make_placement("postnorm")
    f, g = toys
    h = ln(p.norms[0], x + f(x))
    torch.testing.assert_close(p(x, toys), ln(p.norms[1], h + g(h)))


def test_prenorm(toys, x):
    p = make_placement("prenorm")
    f, g = toys
    h = x + f(ln(p.norms[0], x))
    torch.testing.assert_close(p(x, toys), h + g(ln(p.norms[1], h)))


def test_sandwich(toys, x):
    p = make_placement("sandwich")
    f, g = toys
    h = x + ln(p.norms_out[0], f(ln(p.norms_in[0], x)))
    torch.testing.assert_close(p(x, toys), h + ln(p.norms_out[1], g(ln(p.norms_in[1], h))))


@pytest.mark.parametrize("n_layer, alpha, beta", [(1, 1.1892, 0.5946), (12, 2.2134, 0.3195), (48, 3.1302, 0.2259)])
def test_deepnorm_constants(n_layer, alpha, beta):
    """A decoder of N blocks: alpha = (2N)^(1/4), beta = (8N)^(-1/4) (DeepNet, arXiv 2203.00555, Table 1)."""
    assert DeepNorm.residual_scale(n_layer) == pytest.approx(alpha, abs=1e-4)
    assert DeepNorm.init_scale(n_layer) == pytest.approx(beta, abs=1e-4)


def test_deepnorm_alpha_scales_the_residual_not_the_sublayer(toys, x):
    p = make_placement("deepnorm", n_layer=12)
    f, g = toys
    a = (2 * 12) ** 0.25
    h = ln(p.norms[0], a * x + f(x))
    torch.testing.assert_close(p(x, toys), ln(p.norms[1], a * h + g(h)))


def test_rezero_starts_as_the_identity_and_has_no_norm(toys, x):
    p = make_placement("rezero")
    torch.testing.assert_close(p(x, toys), x)
    assert list(p.gates.detach()) == [0.0, 0.0]
    assert not any(isinstance(m, Norm) for m in p.modules())  # x + g * f(x): no norm anywhere
    with torch.no_grad():
        p.gates.copy_(torch.tensor([0.5, -0.25]))
    f, g = toys
    h = x + 0.5 * f(x)
    torch.testing.assert_close(p(x, toys), h - 0.25 * g(h))


def test_noresidual_has_no_skip(toys, x):
    p = make_placement("noresidual")
    f, g = toys
    torch.testing.assert_close(p(x, toys), ln(p.norms[1], g(ln(p.norms[0], f(x)))))
    zero = (lambda t: torch.zeros_like(t),) * 2
    out = p(x, zero)  # with zero sublayers, nothing of x survives
    torch.testing.assert_close(out, p.norms[1].bias.expand_as(out))


@pytest.mark.parametrize("n_layer, n_post", [(12, 3), (24, 6), (4, 1), (3, 0), (8, 2)], ids=lambda v: str(v))
def test_mixln_switches_from_post_to_pre_norm_at_floor_quarter(n_layer, n_post):
    kinds = [type(make_placement("mixln", layer, n_layer).inner).__name__ for layer in range(n_layer)]
    assert kinds == ["PostNorm"] * n_post + ["PreNorm"] * (n_layer - n_post)
    assert n_post == math.floor(0.25 * n_layer)


def test_mixln_post_block_computes_postnorm(toys, x):
    p = make_placement("mixln", layer=0, n_layer=12)
    f, g = toys
    norms = p.inner.norms
    h = ln(norms[0], x + f(x))
    torch.testing.assert_close(p(x, toys), ln(norms[1], h + g(h)))


@pytest.mark.parametrize("layer", [0, 3, 11])
def test_lns_scales_norm_output_by_inverse_sqrt_depth(toys, x, layer):
    p = make_placement("lns", layer=layer, n_layer=12)
    f, g = toys
    s = 1 / math.sqrt(layer + 1)
    h = x + f(ln(p.norms[0], x) * s)
    torch.testing.assert_close(p(x, toys), h + g(ln(p.norms[1], h) * s))


def test_lns_drops_depth_scaled_init():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=12, n_head=2, n_embd=256, placement="lns"))
    # 0.02, not GPT-2's 0.02 / sqrt(2 x 12) (tests/test_init.py): the scaling by depth is in the forward pass
    assert model.blocks[5].attn.c_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_b2t_skips_from_block_input_to_last_norm(toys, x):
    p = make_placement("b2t")
    f, g = toys
    h = ln(p.norms[0], x + f(x))
    torch.testing.assert_close(p(x, toys), ln(p.norms[1], h + g(h) + x))


def test_resi_dual_two_streams_and_readout(toys, x):
    p = make_placement("resi_dual")
    f, g = toys
    stream = p.embed(x)
    torch.testing.assert_close(stream[1], torch.zeros_like(x))
    xo, do = p(stream, toys)
    o1 = f(x)
    h = ln(p.norms[0], x + o1)
    o2 = g(h)
    torch.testing.assert_close(xo, ln(p.norms[1], h + o2))
    torch.testing.assert_close(do, o1 + o2)
    readout = type(p).build_readout(lambda: LayerNorm(C))
    torch.testing.assert_close(readout((xo, do)), xo + F.layer_norm(do, (C,)))


def test_peri_ln_is_sandwich_on_normed_embeddings():
    cfg = dict(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16)
    torch.manual_seed(0)
    peri = GPT(GPTConfig(placement="peri_ln", **cfg))
    torch.manual_seed(0)
    sandwich = GPT(GPTConfig(placement="sandwich", **cfg))
    assert isinstance(peri.embedding_norm, LayerNorm) and isinstance(sandwich.embedding_norm, nn.Identity)
    with torch.no_grad():
        peri.embedding_norm.weight.uniform_(0.5, 1.5)
        peri.embedding_norm.bias.uniform_(-0.5, 0.5)
    idx = torch.randint(0, 64, (2, 8))
    seen = {}
    peri.blocks[0].register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0]))
    peri(idx)
    x = peri.wte(idx) + peri.wpe(torch.arange(8))  # (B, T, C)
    torch.testing.assert_close(seen["x"], ln(peri.embedding_norm, x))
    state = {k: v for k, v in peri.state_dict().items() if not k.startswith("embedding_norm.")}
    sandwich.load_state_dict(state)  # the same blocks and readout: only the embedding norm is new
    stream = ln(peri.embedding_norm, x)
    for block in sandwich.blocks:
        stream = block(stream)
    torch.testing.assert_close(peri(idx)[0], sandwich.lm_head(sandwich.readout(stream)))


def test_rezero_shared_gates_both_sublayers_with_one_scalar(toys, x):
    p = make_placement("rezero_shared")
    torch.testing.assert_close(p(x, toys), x)
    assert list(p.gates.shape) == [1]
    with torch.no_grad():
        p.gates.fill_(0.5)
    f, g = toys
    h = x + 0.5 * f(x)
    torch.testing.assert_close(p(x, toys), h + 0.5 * g(h))


def test_resi_dual_embed_starts_its_dual_stream_at_the_embeddings(toys, x):
    p = make_placement("resi_dual_embed")
    f, g = toys
    stream = p.embed(x)
    torch.testing.assert_close(stream[1], x)
    xo, do = p(stream, toys)
    o1 = f(x)
    o2 = g(ln(p.norms[0], x + o1))
    torch.testing.assert_close(do, x + o1 + o2)  # ResiDual's sum, plus the embeddings
    readout = type(p).build_readout(lambda: LayerNorm(C))
    torch.testing.assert_close(readout((xo, do)), xo + F.layer_norm(do, (C,)))


# What each formula applies to the last block's output before the LM head: a norm, nothing, or (ResiDual) its
# two streams' readout, whose formula test_resi_dual_two_streams_and_readout checks.
READOUT = {"postnorm": nn.Identity, "prenorm": LayerNorm, "sandwich": LayerNorm, "deepnorm": nn.Identity,
           "rezero": nn.Identity, "mixln": LayerNorm, "lns": LayerNorm, "b2t": nn.Identity,
           "noresidual": nn.Identity, "rezero_shared": nn.Identity, "peri_ln": LayerNorm,
           "resi_dual": ResiDualReadout, "resi_dual_embed": ResiDualReadout}  # fmt: skip


@pytest.mark.parametrize("name", sorted(READOUT))
def test_final_norm_only_where_the_formula_has_one(name):
    readout = PLACEMENTS.get(name).build_readout(lambda role=None: LayerNorm(C))
    assert type(readout) is READOUT[name]


def test_every_registered_placement_has_its_readout_checked():
    assert sorted(READOUT) == PLACEMENTS.names()


def test_unknown_placement_lists_valid_names():
    with pytest.raises(ValueError, match="unknown placement 'peri'.*b2t, deepnorm, lns, mixln"):
        GPTConfig(placement="peri")


def test_placement_docstrings_carry_formula_and_diagram():
    for name in PLACEMENTS.names():
        doc = PLACEMENTS.get(name).__doc__
        assert "x" in doc and ("──" in doc), f"{name} lacks a diagram"

"""Each placement against its formula (from the paper its docstring cites) on toy sublayers."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.norms import LayerNorm
from resnorm_lm.model.placements import PLACEMENTS, BlockContext, DeepNorm

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


@pytest.mark.parametrize("n_layer", [1, 6, 12, 24, 100])
def test_deepnorm_constants(n_layer):
    assert DeepNorm.residual_scale(n_layer) == pytest.approx((2 * n_layer) ** 0.25)
    assert DeepNorm.init_scale(n_layer) == pytest.approx((8 * n_layer) ** -0.25)
    assert DeepNorm.residual_scale(n_layer) > 1 > DeepNorm.init_scale(n_layer) or n_layer < 1


def test_deepnorm_constants_known_values():
    assert DeepNorm.residual_scale(12) == pytest.approx(24**0.25) == pytest.approx(2.2134, abs=1e-4)
    assert DeepNorm.init_scale(12) == pytest.approx(0.3195, abs=1e-4)  # 96^(-1/4)


def test_deepnorm_alpha_scales_the_residual_not_the_sublayer(toys, x):
    p = make_placement("deepnorm", n_layer=12)
    f, g = toys
    a = (2 * 12) ** 0.25
    h = ln(p.norms[0], a * x + f(x))
    torch.testing.assert_close(p(x, toys), ln(p.norms[1], a * h + g(h)))


def test_deepnorm_init_divides_value_output_and_mlp_weights_by_8n_to_the_quarter():
    torch.manual_seed(0)
    cfg = dict(vocab_size=64, block_size=8, n_layer=6, n_head=2, n_embd=256, bias=False)
    deep = GPT(GPTConfig(placement="deepnorm", **cfg))
    beta = (8 * 6) ** -0.25
    attn, mlp = deep.blocks[0].attn, deep.blocks[0].mlp
    q_std = attn.c_attn.weight[:256].std().item()
    v_std = attn.value_weight().std().item()
    assert q_std == pytest.approx(0.02, rel=0.05)  # queries and keys keep the plain init
    for what, w in [("v", attn.value_weight()), ("out", attn.c_proj.weight), ("fc", mlp.c_fc.weight)]:
        assert w.std().item() == pytest.approx(0.02 * beta, rel=0.05), what
    assert v_std / q_std == pytest.approx(beta, rel=0.08)


def test_rezero_starts_as_the_identity(toys, x):
    p = make_placement("rezero")
    torch.testing.assert_close(p(x, toys), x)
    assert list(p.gates.detach()) == [0.0, 0.0]
    with torch.no_grad():
        p.gates.copy_(torch.tensor([0.5, -0.25]))
    f, g = toys
    h = x + 0.5 * f(x)
    torch.testing.assert_close(p(x, toys), h - 0.25 * g(h))


def test_rezero_model_is_identity_blocks_at_init():
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=3, n_head=2, n_embd=16, placement="rezero"))
    idx = torch.randint(0, 64, (2, 8))
    x = model.wte(idx) + model.wpe(torch.arange(8))
    stream = x
    for block in model.blocks:
        stream = block(stream)
    torch.testing.assert_close(stream, x)
    assert not any("norm" in n for n, _ in model.named_parameters())  # ReZero: no norm at all


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
    assert model.blocks[5].attn.c_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    pre = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=12, n_head=2, n_embd=256, placement="prenorm"))
    assert pre.blocks[5].attn.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(24), rel=0.05)


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


@pytest.mark.parametrize(
    "name, final_norm",
    [
        ("postnorm", False),
        ("prenorm", True),
        ("sandwich", True),
        ("deepnorm", False),
        ("rezero", False),
        ("mixln", True),
        ("lns", True),
        ("b2t", False),
        ("noresidual", False),
        ("rezero_shared", False),
        ("peri_ln", True),
    ],
)
def test_final_norm_only_where_the_formula_has_one(name, final_norm):
    readout = PLACEMENTS.get(name).build_readout(lambda role=None: LayerNorm(C))
    assert isinstance(readout, LayerNorm) == final_norm
    assert isinstance(readout, nn.Identity) == (not final_norm)


def test_every_registered_placement_is_tested_for_its_readout():
    assert set(PLACEMENTS.names()) == {
        "postnorm",
        "prenorm",
        "sandwich",
        "deepnorm",
        "rezero",
        "mixln",
        "lns",
        "b2t",
        "resi_dual",
        "resi_dual_embed",
        "rezero_shared",
        "peri_ln",
        "noresidual",
    }


def test_unknown_placement_lists_valid_names():
    with pytest.raises(ValueError, match="unknown placement 'peri'.*b2t, deepnorm, lns, mixln"):
        GPTConfig(placement="peri")


def test_placement_docstrings_carry_formula_and_diagram():
    for name in PLACEMENTS.names():
        doc = PLACEMENTS.get(name).__doc__
        assert "x" in doc and ("──" in doc), f"{name} lacks a diagram"

"""Each placement against its formula (from the paper its docstring cites) on toy sublayers."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from resnorm_lm.model.block import ResidualStream
from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.norms import LayerNorm, Norm
from resnorm_lm.model.placements import PLACEMENTS, DeepNorm, DualStream
from tests.toy_sublayers import C, Toy, Zero, ln, make_norm


def config(name: str = "prenorm", n_layer: int = 4) -> GPTConfig:
    return GPTConfig(vocab_size=64, block_size=8, n_layer=n_layer, n_head=2, n_embd=C, placement=name)


def make_placement(name, layer=0, n_layer=4):
    """Block ``layer`` of ``name`` with toy sublayers: ``f`` in place of attention, ``g`` of the MLP."""
    block = PLACEMENTS.get(name)(config(name, n_layer), layer, make_norm)
    block.attn, block.mlp = Toy(1), Toy(2)
    return block


@pytest.fixture
def toys():
    return Toy(1), Toy(2)


@pytest.fixture
def x():
    return torch.randn(2, 3, C) * 3


def test_postnorm(toys, x):
    p = make_placement("postnorm")
    f, g = toys
    h = ln(p.attn_norm, x + f(x))
    torch.testing.assert_close(p(x), ln(p.mlp_norm, h + g(h)))


def test_prenorm(toys, x):
    p = make_placement("prenorm")
    f, g = toys
    h = x + f(ln(p.attn_norm, x))
    torch.testing.assert_close(p(x), h + g(ln(p.mlp_norm, h)))


def test_sandwich(toys, x):
    p = make_placement("sandwich")
    f, g = toys
    h = x + ln(p.attn_out_norm, f(ln(p.attn_in_norm, x)))
    torch.testing.assert_close(p(x), h + ln(p.mlp_out_norm, g(ln(p.mlp_in_norm, h))))


def test_olmo2_reordered_norm_normalizes_the_outputs_not_the_inputs(toys, x):
    """OLMo 2, eqs. 1-2 (arXiv 2501.00656; eq. 2's MLP(x) is MLP(h), as its section 3.3.2 and OLMo-core have it):
    h = x + Norm(Attn(x)),  out = h + Norm(MLP(h))."""
    p = make_placement("olmo2")
    f, g = toys
    h = x + ln(p.attn_norm, f(x))
    torch.testing.assert_close(p(x), h + ln(p.mlp_norm, g(h)))


@pytest.mark.parametrize("n_layer, alpha, beta", [(1, 1.1892, 0.5946), (12, 2.2134, 0.3195), (48, 3.1302, 0.2259)])
def test_deepnorm_constants(n_layer, alpha, beta):
    """A decoder of N blocks: alpha = (2N)^(1/4), beta = (8N)^(-1/4) (DeepNet, arXiv 2203.00555, Table 1)."""
    assert DeepNorm.residual_scale(n_layer) == pytest.approx(alpha, abs=1e-4)
    assert DeepNorm.init_scale(n_layer) == pytest.approx(beta, abs=1e-4)


def test_deepnorm_alpha_scales_the_residual_not_the_sublayer(toys, x):
    p = make_placement("deepnorm", n_layer=12)
    f, g = toys
    a = (2 * 12) ** 0.25
    h = ln(p.attn_norm, a * x + f(x))
    torch.testing.assert_close(p(x), ln(p.mlp_norm, a * h + g(h)))


def test_rezero_starts_as_the_identity_and_has_no_norm(toys, x):
    p = make_placement("rezero")
    torch.testing.assert_close(p(x), x)
    assert list(p.alpha.detach()) == [0.0, 0.0]
    assert not any(isinstance(m, Norm) for m in p.modules())  # x + g * f(x): no norm anywhere
    with torch.no_grad():
        p.alpha.copy_(torch.tensor([0.5, -0.25]))
    f, g = toys
    h = x + 0.5 * f(x)
    torch.testing.assert_close(p(x), h - 0.25 * g(h))


def test_noresidual_has_no_skip(toys, x):
    p = make_placement("noresidual")
    f, g = toys
    torch.testing.assert_close(p(x), ln(p.mlp_norm, g(ln(p.attn_norm, f(x)))))
    p.attn = p.mlp = Zero()
    out = p(x)  # with zero sublayers, nothing of x survives
    torch.testing.assert_close(out, p.mlp_norm.bias.expand_as(out))


@pytest.mark.parametrize("n_layer, n_post", [(12, 3), (24, 6), (4, 1), (3, 0), (8, 2)], ids=lambda v: str(v))
def test_mixln_switches_from_post_to_pre_norm_at_floor_quarter(n_layer, n_post):
    kinds = ["post" if make_placement("mixln", layer, n_layer).post else "pre" for layer in range(n_layer)]
    assert kinds == ["post"] * n_post + ["pre"] * (n_layer - n_post)
    assert n_post == math.floor(0.25 * n_layer)


def test_mixln_post_block_computes_postnorm(toys, x):
    p = make_placement("mixln", layer=0, n_layer=12)
    f, g = toys
    h = ln(p.attn_norm, x + f(x))
    torch.testing.assert_close(p(x), ln(p.mlp_norm, h + g(h)))


def test_mixln_pre_block_computes_prenorm(toys, x):
    p = make_placement("mixln", layer=3, n_layer=12)
    f, g = toys
    h = x + f(ln(p.attn_norm, x))
    torch.testing.assert_close(p(x), h + g(ln(p.mlp_norm, h)))


@pytest.mark.parametrize("layer", [0, 3, 11])
def test_lns_scales_norm_output_by_inverse_sqrt_depth(toys, x, layer):
    p = make_placement("lns", layer=layer, n_layer=12)
    f, g = toys
    s = 1 / math.sqrt(layer + 1)
    h = x + f(ln(p.attn_norm, x) * s)
    torch.testing.assert_close(p(x), h + g(ln(p.mlp_norm, h) * s))


def test_lns_drops_depth_scaled_init():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=12, n_head=2, n_embd=256, placement="lns"))
    # 0.02, not GPT-2's 0.02 / sqrt(2 x 12) (tests/test_init.py): the scaling by depth is in the forward pass
    assert model.blocks[5].attn.c_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_b2t_skips_from_block_input_to_last_norm(toys, x):
    p = make_placement("b2t")
    f, g = toys
    h = ln(p.attn_norm, x + f(x))
    torch.testing.assert_close(p(x), ln(p.mlp_norm, h + g(h) + x))


def test_resi_dual_two_streams_and_readout(toys, x):
    p = make_placement("resi_dual")
    f, g = toys
    ends = DualStream(config("resi_dual"), [p], final_norm=LayerNorm(C))
    stream = ends.enter(x)
    torch.testing.assert_close(stream[1], torch.zeros_like(x))
    xo, do = p(stream)
    o1 = f(x)
    h = ln(p.attn_norm, x + o1)
    o2 = g(h)
    torch.testing.assert_close(xo, ln(p.mlp_norm, h + o2))
    torch.testing.assert_close(do, o1 + o2)
    torch.testing.assert_close(ends.exit((xo, do)), xo + F.layer_norm(do, (C,)))


@pytest.mark.parametrize(("normed", "plain"), [("peri_ln", "sandwich"), ("olmo2_embed_norm", "olmo2")])
def test_a_placement_on_normed_embeddings_is_its_plain_one_after_an_embedding_norm(normed, plain):
    cfg = dict(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16)
    torch.manual_seed(0)
    with_norm = GPT(GPTConfig(placement=normed, **cfg))
    torch.manual_seed(0)
    without = GPT(GPTConfig(placement=plain, **cfg))
    assert isinstance(with_norm.stream.embed_norm, LayerNorm) and isinstance(without.stream.embed_norm, nn.Identity)
    with torch.no_grad():
        with_norm.stream.embed_norm.weight.uniform_(0.5, 1.5)
        with_norm.stream.embed_norm.bias.uniform_(-0.5, 0.5)
    idx = torch.randint(0, 64, (2, 8))
    seen = {}
    with_norm.blocks[0].register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0]))
    with_norm(idx)
    x = with_norm.wte(idx) + with_norm.wpe(torch.arange(8))  # (B, T, C)
    torch.testing.assert_close(seen["x"], ln(with_norm.stream.embed_norm, x))
    state = {k: v for k, v in with_norm.state_dict().items() if not k.startswith("stream.embed_norm.")}
    without.load_state_dict(state)  # the same blocks and final norm: only the embedding norm is new
    stream = ln(with_norm.stream.embed_norm, x)
    for block in without.blocks:
        stream = block(stream)
    torch.testing.assert_close(with_norm(idx)[0], without.lm_head(without.stream.exit(stream)))


def test_rezero_shared_gates_both_sublayers_with_one_scalar(toys, x):
    p = make_placement("rezero_shared")
    torch.testing.assert_close(p(x), x)
    assert list(p.alpha.shape) == [1]
    with torch.no_grad():
        p.alpha.fill_(0.5)
    f, g = toys
    h = x + 0.5 * f(x)
    torch.testing.assert_close(p(x), h + 0.5 * g(h))


def test_resi_dual_embed_starts_its_dual_stream_at_the_embeddings(toys, x):
    p = make_placement("resi_dual_embed")
    f, g = toys
    ends = PLACEMENTS.get("resi_dual_embed").residual_stream(
        config("resi_dual_embed", 1), lambda role=None: LayerNorm(C)
    )
    stream = ends.enter(x)
    torch.testing.assert_close(stream[1], x)
    xo, do = p(stream)
    o1 = f(x)
    o2 = g(ln(p.attn_norm, x + o1))
    torch.testing.assert_close(do, x + o1 + o2)  # ResiDual's sum, plus the embeddings
    torch.testing.assert_close(ends.exit((xo, do)), xo + F.layer_norm(do, (C,)))


# What each formula applies to the stream leaving the last block before the LM head: a norm, nothing, or
# (ResiDual) its two streams' readout, whose formula test_resi_dual_two_streams_and_readout checks.
FINAL = {
    "postnorm": nn.Identity,
    "prenorm": LayerNorm,
    "sandwich": LayerNorm,
    "deepnorm": nn.Identity,
    "rezero": nn.Identity,
    "mixln": LayerNorm,
    "lns": LayerNorm,
    "b2t": nn.Identity,
    "noresidual": nn.Identity,
    "rezero_shared": nn.Identity,
    "peri_ln": LayerNorm,
    "resi_dual": LayerNorm,
    "resi_dual_embed": LayerNorm,
    "olmo2": LayerNorm,
    "olmo2_embed_norm": LayerNorm,
    "hc": LayerNorm,
    "mhc": LayerNorm,
    "attnres": LayerNorm,
    "attnres_block": LayerNorm,
    "denseformer": LayerNorm,
}
OWN_STREAM = {"resi_dual", "resi_dual_embed", "hc", "mhc", "attnres", "attnres_block", "denseformer"}


@pytest.mark.parametrize("name", sorted(FINAL))
def test_final_norm_only_where_the_formula_has_one(name):
    stream = PLACEMENTS.get(name).residual_stream(config(name, 1), lambda role=None: LayerNorm(C))
    assert type(stream.final_norm) is FINAL[name]
    assert isinstance(stream, DualStream) == name.startswith("resi_dual")  # x + LN(d): the dual stream's exit
    assert (type(stream) is ResidualStream) == (name not in OWN_STREAM)  # a stream of more than one tensor


def test_every_registered_placement_has_its_final_norm_checked():
    assert sorted(FINAL) == PLACEMENTS.names()


def test_unknown_placement_lists_valid_names():
    valid = "attnres, attnres_block, b2t, deepnorm, denseformer, hc, lns, mhc, mixln"
    with pytest.raises(ValueError, match=f"unknown placement 'peri'.*{valid}"):
        GPTConfig(placement="peri")


def test_placement_docstrings_carry_formula_and_diagram():
    """Each placement's docstring has an equation (a line with ``=`` that names x) and a diagram (box-drawing
    arrows), and cites its paper by arXiv id or reference code, except the plain no-residual ablation."""
    for name in PLACEMENTS.names():
        doc = PLACEMENTS.get(name).__doc__ or ""
        lines = doc.splitlines()
        assert any("=" in line and "x" in line for line in lines), f"{name}: no formula"
        assert any("──>" in line for line in lines), f"{name}: no diagram"
        assert "arXiv" in doc or "reference code" in doc or name == "noresidual", f"{name}: no reference"


def test_the_docstring_check_fails_on_a_placement_without_one(monkeypatch):
    class Undocumented(PLACEMENTS.get("prenorm")):
        """Pre-norm."""

    monkeypatch.setitem(PLACEMENTS._entries, "undocumented", Undocumented)
    with pytest.raises(AssertionError, match="undocumented: no formula"):
        test_placement_docstrings_carry_formula_and_diagram()

"""Attention Residuals (full and by blocks) and DenseFormer against their papers' equations written out plainly, on
toy sublayers; at init; in a GPT (gradients, causality); and on the per-block machinery (stream RMS, skips)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from resnorm_lm.analysis.block_measurements import measure, skipped
from resnorm_lm.model.depth_attention import AttnRes, BlockAttnRes, DenseFormer, DepthAttention
from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.placements import PLACEMENTS
from resnorm_lm.train.diagnostics import StreamRMS
from tests.toy_sublayers import C, Toy, ln, make_norm

EPS = 1e-5
DESIGNS = ["attnres", "attnres_block", "denseformer"]


def config(name: str, n_layer: int = 3, **overrides) -> GPTConfig:
    return GPTConfig(vocab_size=64, block_size=8, n_layer=n_layer, n_head=2, n_embd=C, placement=name, **overrides)


def toy_stream(name: str, n_layer: int):
    """``name``'s stream with toy sublayers (attention of block l: Toy(2l + 1), MLP: Toy(2l + 2)) and random queries,
    key-norm gains and DWA weights, so that every term of the formula shows."""
    torch.manual_seed(0)
    stream = PLACEMENTS.get(name).residual_stream(config(name, n_layer), make_norm)
    for l, block in enumerate(stream.blocks):
        block.attn, block.mlp = Toy(2 * l + 1), Toy(2 * l + 2)
    randomize(stream)
    return stream


def randomize(module: nn.Module) -> None:
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, DepthAttention):
                m.query.normal_(0.0, 1.0)
                m.key_norm.weight.uniform_(0.5, 1.5)
            if isinstance(m, DenseFormer):
                m.dwa.normal_(0.0, 0.5)


def sublayers(stream):
    """(f, its pre-norm, its depth attention or None) for each sublayer in order."""
    out = []
    for block in stream.blocks:
        out += [(block.attn, block.attn_norm, block.attn_res), (block.mlp, block.mlp_norm, block.mlp_res)]
    return out


def attend(values, res, w_if_none=None):
    """Eq. 2-4: sum_i softmax_i(w . RMSNorm(v_i)) v_i, with the stacked values (spec section 3.2, einsum form)."""
    w, g = (res.query, res.key_norm.weight) if res is not None else (w_if_none, torch.ones(C))
    V = torch.stack(values)  # (N, B, T, C)
    K = V / torch.sqrt(V.pow(2).mean(-1, keepdim=True) + EPS) * g  # RMSNorm over C
    a = torch.softmax(torch.einsum("c,nbtc->nbt", w, K), dim=0)
    return torch.einsum("nbt,nbtc->btc", a, V)


def full_attnres(x, stream, drop=()):
    """Full AttnRes written out: V = [x], then each sublayer appends F(LN(h)); the sublayers at ``drop`` removed."""
    V = [x]
    for j, (f, norm, res) in enumerate(sublayers(stream)):
        if j not in drop:
            V.append(f(ln(norm, attend(V, res, w_if_none=torch.randn(C)))))  # the first: one value, any w
    return ln(stream.final_norm, attend(V, stream.readout))


def block_attnres(x, stream, S, drop=()):
    """Block AttnRes as the text has it (spec 3.1, last bullet): blocks = [b_0 = x], a partial sum that starts
    empty; sublayer j belongs to block j // S + 1; a block's partial sum is closed when a later block begins."""
    blocks, partial, current = [x], None, None
    for j, (f, norm, res) in enumerate(sublayers(stream)):
        if j in drop:
            continue
        if partial is not None and j // S != current:
            blocks, partial = blocks + [partial], None
        h = attend(blocks + ([partial] if partial is not None else []), res, w_if_none=torch.randn(C))
        out = f(ln(norm, h))
        partial, current = (out if partial is None else partial + out), j // S
    return ln(stream.final_norm, attend(blocks + [partial], stream.readout))


def denseformer(x, stream, a=None):
    """DenseFormer written out: X_0 = x; X_{i+1} = pre-norm block i (Y_{i-1}); Y_i = sum_j a_{i,j} X_j."""
    X, Y = [x], x
    for i, block in enumerate(stream.blocks):
        h = Y + block.attn(ln(block.attn_norm, Y))
        X.append(h + block.mlp(ln(block.mlp_norm, h)))
        alpha = block.dwa if a is None else a[i]
        Y = sum(alpha[j] * X[j] for j in range(i + 2))
    return ln(stream.final_norm, Y)


@pytest.fixture
def x():
    return torch.randn(2, 3, C) * 3


def test_full_attnres_is_its_formula(x):
    stream = toy_stream("attnres", n_layer=3)
    assert stream.blocks[0].attn_res is None  # softmax over v_0 alone is 1: no query to learn
    torch.testing.assert_close(stream(x), full_attnres(x, stream))


@pytest.mark.parametrize("max_blocks, S", [(3, 3), (4, 2), (2, 4)])
def test_block_attnres_is_its_formula(x, monkeypatch, max_blocks, S):
    """8 sublayers in blocks of 3 (a block ending inside a transformer block, the last one of 2), 2 and 4."""
    monkeypatch.setattr(BlockAttnRes, "max_blocks", max_blocks)
    assert BlockAttnRes.sublayers_per_block(4) == S
    stream = toy_stream("attnres_block", n_layer=4)
    torch.testing.assert_close(stream(x), block_attnres(x, stream, S))
    values = stream.blocks[3](stream.blocks[2](stream.blocks[1](stream.blocks[0](stream.enter(x)))))
    assert len(values) == 1 + math.ceil(8 / S)  # b_0 and one sum per depth-block: the embeddings counted once
    assert not any(torch.equal(v, x) for v in values[1:])


@pytest.mark.parametrize("n_layer, S, n_blocks", [(12, 3, 8), (16, 4, 8), (24, 6, 8), (6, 2, 6), (4, 1, 8), (1, 1, 2)])
def test_block_attnres_makes_at_most_eight_depth_blocks(n_layer, S, n_blocks):
    assert BlockAttnRes.sublayers_per_block(n_layer) == S and math.ceil(2 * n_layer / S) == n_blocks
    assert AttnRes.sublayers_per_block(n_layer) == 1


def test_block_attnres_of_one_sublayer_per_block_is_full_attnres(monkeypatch):
    """N = L recovers Full AttnRes (the paper, section 3.2): the same weights give the same logits."""
    assert BlockAttnRes.sublayers_per_block(2) == 1  # as it stands, a model of 2 blocks is Full AttnRes
    torch.manual_seed(0)
    full = GPT(config("attnres", n_layer=6))
    randomize(full)
    monkeypatch.setattr(BlockAttnRes, "max_blocks", 12)
    block = GPT(config("attnres_block", n_layer=6))
    block.load_state_dict(full.state_dict())
    idx = torch.randint(0, 64, (2, 8))
    torch.testing.assert_close(block(idx)[0], full(idx)[0], rtol=0, atol=0)


def test_depth_attention_folds_the_norm_gain_into_the_query():
    """The class computes (w * g) . v / rms(v); the paper's w . RMSNorm(v), with this package's RMSNorm."""
    res = DepthAttention(C, EPS)
    randomize(res)
    values = tuple(torch.randn(2, 5, C) * s for s in (0.02, 1.0, 30.0))
    logits = torch.stack([res.key_norm(v) @ res.query for v in values])  # (N, B, T)
    torch.testing.assert_close(res.weights(values), logits.softmax(0))


def test_denseformer_is_its_formula(x):
    stream = toy_stream("denseformer", n_layer=3)
    torch.testing.assert_close(stream(x), denseformer(x, stream))


@pytest.mark.parametrize("init", ["gpt2", "plain", "xavier", "xavier_rescaled"])
def test_the_init_survives_the_models_init_rules(init):
    """Queries zero and key-norm gains one (AttnRes), each DWA the identity (DenseFormer), after ``GPT(...)``."""
    for name in DESIGNS:
        model = GPT(config(name, n_layer=4, init=init))
        for m in model.modules():
            if isinstance(m, DepthAttention):
                assert torch.equal(m.query, torch.zeros(C)) and torch.equal(m.key_norm.weight, torch.ones(C))
        for i, block in enumerate(model.blocks if name == "denseformer" else []):
            assert torch.equal(block.dwa, F.one_hot(torch.tensor(i + 1), i + 2).float())


def test_attnres_weighs_the_depth_uniformly_at_init():
    model = GPT(config("attnres", n_layer=3))
    values = tuple(torch.randn(2, 8, C) * s for s in (0.02, 1.0, 5.0, 0.3))
    for res in [m for m in model.modules() if isinstance(m, DepthAttention)]:
        torch.testing.assert_close(res.weights(values), torch.full((4, 2, 8), 0.25))
        torch.testing.assert_close(res(values), sum(values) / 4)


def test_denseformer_is_prenorm_at_init():
    torch.manual_seed(0)
    pre = GPT(config("prenorm", n_layer=4))
    dense = GPT(config("denseformer", n_layer=4))
    missing, unexpected = dense.load_state_dict(pre.state_dict(), strict=False)
    assert sorted(missing) == [f"stream.blocks.{i}.dwa" for i in range(4)] and not unexpected
    idx = torch.randint(0, 64, (2, 8))
    assert torch.equal(dense(idx)[0], pre(idx)[0])
    with skipped(dense.blocks[1]), skipped(pre.blocks[1]):  # a skipped block is the identity in both
        assert torch.equal(dense(idx)[0], pre(idx)[0])


def logits_and_readout_variance(model: GPT, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The model's logits and the variance over the channels (mean over the tokens) of its final norm's input."""
    readout_input = []  # (B, T, C)
    hook = model.stream.final_norm.register_forward_hook(lambda m, args, out: readout_input.append(args[0]))
    logits = model(x)[0]
    hook.remove()
    return logits, readout_input[0].var(-1, unbiased=False).mean().item()


def test_attnres_at_init_is_prenorm_up_to_the_norms_eps():
    """Every pre-norm reads LN(sum of the values); AttnRes at init reads LN(their mean): the same but for eps. At
    the GPT-2 init the mean of many small values falls below LN's default eps (1e-5) at depth, which shrinks what
    the deep sublayers and the readout read: the AttnRes recipes set 1e-8 (docs/results/attnres-eps/attnres-eps.md)."""
    x = torch.randint(0, 64, (2, 8))
    differences, readout_variance = [], []
    for eps in (1e-12, 1e-5):
        torch.manual_seed(0)
        kw = dict(vocab_size=64, block_size=8, n_layer=4, n_head=2, n_embd=C, norm_eps=eps)
        pre = GPT(GPTConfig(placement="prenorm", **kw)).double()
        att = GPT(GPTConfig(placement="attnres", **kw)).double()
        missing, unexpected = att.load_state_dict(pre.state_dict(), strict=False)
        assert all(".query" in k or ".key_norm." in k for k in missing) and not unexpected
        logits, variance = logits_and_readout_variance(att, x)
        differences.append((pre(x)[0] - logits).abs().max().item())
        readout_variance.append(variance)
    assert differences[0] < 1e-6  # eps 1e-12: the same logits
    assert readout_variance[1] < 1e-5 and differences[1] > 1e-2  # eps 1e-5 dominates the readout's input


@pytest.fixture(params=[*DESIGNS, "attnres_block_of_3"])
def design(request, monkeypatch):
    """Each placement; ``attnres_block_of_3``: Block AttnRes with 6 sublayers in 2 blocks of 3 (at 3 blocks the
    default rule gives one sublayer per block, Full AttnRes)."""
    if request.param == "attnres_block_of_3":
        monkeypatch.setattr(BlockAttnRes, "max_blocks", 2)
        return "attnres_block"
    return request.param


def test_forward_backward_reaches_every_parameter(design):
    torch.manual_seed(0)
    model = GPT(config(design))
    idx = torch.randint(0, 64, (4, 8))
    _, loss = model(idx, torch.randint(0, 64, (4, 8)))
    loss.backward()
    gains = {n for n, _ in model.named_parameters() if "key_norm" in n}
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        # a zero query gives its key norm's gain no gradient (the logit is w . g v / rms(v)): only once w moves
        assert (p.grad.abs().sum() == 0) == (name in gains), name
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, DepthAttention):
                m.query.normal_(0.0, 0.1)
    model.zero_grad()
    model(idx, idx)[1].backward()
    assert all(p.grad.abs().sum() > 0 for n, p in model.named_parameters() if n in gains)


def test_the_future_never_reaches_the_past(design):
    model = GPT(config(design, dropout=0.0)).eval()
    randomize(model)
    idx = torch.randint(0, 64, (2, 8))
    t = 5
    changed = idx.clone()
    changed[:, t] = (idx[:, t] + 1) % 64
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=0)
    assert (a[:, t] - b[:, t]).abs().max() > 0


def test_the_per_block_measurements_read_each_stream(design):
    """Stream RMS and layer contribution (hooks on each block, and skips) run on these streams; ``residual`` is the
    values' sum (AttnRes) or Y (DenseFormer), ``block_input`` the values' mean or Y."""
    torch.manual_seed(0)
    model = GPT(config(design))
    randomize(model)
    recorder = StreamRMS(model)
    recorder.active = True
    idx = torch.randint(0, 64, (3, 8))
    with torch.no_grad():
        model(idx)
        recorder.active = False
        stream = model.stream.enter(model.wte(idx) + model.wpe(torch.arange(8)))
        for block in model.blocks:
            stream = block(stream)
    if design == "denseformer":
        assert model.stream.residual(stream) is stream[1] and model.stream.block_input(stream) is stream[1]
    else:
        torch.testing.assert_close(model.stream.residual(stream), sum(stream))
        torch.testing.assert_close(model.stream.block_input(stream), sum(stream) / len(stream))
    assert recorder.take()[-1].item() == pytest.approx(model.stream.residual(stream).pow(2).mean().sqrt().item())
    result = measure(model.eval(), idx, torch.randint(0, 64, (3, 8)))
    assert all(0.0 < d <= 1.0 for d in result.angular_distance) and all(map(math.isfinite, result.skipped_loss))


def test_skipping_a_block_removes_its_sublayers(x, monkeypatch):
    """A skipped block's outputs are simply absent, in Full AttnRes and in blocks of 3 (sublayers 2 and 3 of blocks
    1 and 2 go; block 2 then begins with sublayer 4, and b_0 stays the embeddings alone)."""
    full = toy_stream("attnres", n_layer=3)
    with skipped(full.blocks[1]):
        torch.testing.assert_close(full(x), full_attnres(x, full, drop=(2, 3)))
    monkeypatch.setattr(BlockAttnRes, "max_blocks", 2)
    blocks = toy_stream("attnres_block", n_layer=3)
    for layer in range(3):
        with skipped(blocks.blocks[layer]):
            torch.testing.assert_close(blocks(x), block_attnres(x, blocks, 3, drop=(2 * layer, 2 * layer + 1)))


def test_a_skipped_denseformer_block_leaves_its_input_as_its_output(x):
    """Skipped (layer contribution), block i is the identity, its DWA included: Y_i = Y_{i-1}, X_{i+1} = Y_{i-1}."""
    stream = toy_stream("denseformer", n_layer=3)
    with skipped(stream.blocks[1]):
        got = stream(x)
    b0, b2 = stream.blocks[0], stream.blocks[2]
    h = x + b0.attn(ln(b0.attn_norm, x))
    X1 = h + b0.mlp(ln(b0.mlp_norm, h))
    Y0 = b0.dwa[0] * x + b0.dwa[1] * X1
    h = Y0 + b2.attn(ln(b2.attn_norm, Y0))
    X3 = h + b2.mlp(ln(b2.mlp_norm, h))
    Y2 = b2.dwa[0] * x + b2.dwa[1] * X1 + b2.dwa[2] * Y0 + b2.dwa[3] * X3
    torch.testing.assert_close(got, ln(stream.final_norm, Y2))


def test_the_depth_weights_are_not_weight_decayed():
    from resnorm_lm.train.optim import parameter_groups

    for name in DESIGNS:
        model = GPT(config(name))
        decayed = {id(p) for p in parameter_groups(model, 0.1)[0]["params"]}
        extra = [p for n, p in model.named_parameters() if n.endswith(("query", "key_norm.weight", "dwa"))]
        assert extra and not any(id(p) in decayed for p in extra)

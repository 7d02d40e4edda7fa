"""Hyper-connections (resnorm_lm/model/hyper_connections.py): HC and mHC against plain transcriptions of their
papers' equations on toy sublayers, Sinkhorn-Knopp, the two ends of the stream, the GPT with ``hc`` and ``mhc``
(at init, forward and backward, bf16 autocast), the composite gain, and lucidrains' hyper-connections package
(PyPI 0.4.11) as a second, independent implementation of HC."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.hyper_connections import (
    STREAMS,
    DynamicHyperConnection,
    HyperStream,
    ManifoldHyperConnection,
    amax_gain,
    composed,
    composite_gain,
    recorded_mixes,
    sinkhorn_knopp,
    token_composite_gain,
    token_gains_from_each_sublayer,
)
from resnorm_lm.model.norms import LayerNorm
from resnorm_lm.model.placements import PLACEMENTS
from tests.toy_sublayers import C, Toy, ln, make_norm

N = STREAMS
TINY = dict(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=C)


def randomized(module: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter moved off its init (static and dynamic parts, scales, gates), so a test sees every term."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    return module


def block(name: str, layer: int = 0, n_layer: int = 4):
    b = PLACEMENTS.get(name)(GPTConfig(**{**TINY, "n_layer": n_layer}, placement=name), layer, make_norm)
    b.attn, b.mlp = Toy(1), Toy(2)
    return b


def gpt(placement: str, seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **overrides}, placement=placement))


@pytest.fixture
def streams():
    return torch.randn(2, 3, N, C) * 3  # (B, T, n, C): n different streams


# ------------------------------------------------------------------ the papers' equations, transcribed


def hc_paper(p: DynamicHyperConnection, H: torch.Tensor, T) -> torch.Tensor:
    """HC (arXiv 2409.19606) Eqs. 10-13 then 3-5, A_m and A_r apart as the paper writes them. H (B, T, n, C): a
    token's rows are its streams; A is [source, target]."""
    Hn = F.layer_norm(H, (C,))  # norm(H): per stream, over d
    W_m, W_r = p.dynamic_alpha[:, :1], p.dynamic_alpha[:, 1:]  # (C, 1), (C, n)
    A_m = p.alpha_scale * torch.tanh(Hn @ W_m) + p.static_alpha[:, :1]  # Eq. 12: (B, T, n, 1)
    A_r = p.alpha_scale * torch.tanh(Hn @ W_r) + p.static_alpha[:, 1:]  # Eq. 13: (B, T, n, n)
    B = p.beta_scale * torch.tanh(Hn @ p.dynamic_beta) + p.static_beta  # Eq. 11: (B, T, n)
    h0 = sum(A_m[..., s, 0, None] * H[..., s, :] for s in range(N))  # Eq. 3: h_0 = A_m^T H
    H_r = torch.stack([sum(A_r[..., s, j, None] * H[..., s, :] for s in range(N)) for j in range(N)], dim=2)  # Eq. 4
    return B[..., None] * T(h0)[..., None, :] + H_r  # Eq. 5: B^T (T h_0)^T + A_r^T H


def sinkhorn_paper(logits: torch.Tensor, iters: int = 20) -> torch.Tensor:
    """mHC Eq. 9 on one (n, n) matrix: M = exp(logits), then T_r(T_c(M)) ``iters`` times."""
    M = torch.exp(logits)
    for _ in range(iters):
        M = M / M.sum(dim=0, keepdim=True)  # T_c: columns
        M = M / M.sum(dim=1, keepdim=True)  # T_r: rows
    return M


def mhc_paper(p: ManifoldHyperConnection, X: torch.Tensor, F_) -> torch.Tensor:
    """mHC (arXiv 2512.24880) Eqs. 7-9 and 3, token by token. X (B, T, n, C): x_l (n, C) per token."""
    phi_pre, phi_post, phi_res = p.phi[:, :N], p.phi[:, N : 2 * N], p.phi[:, 2 * N :]
    x_in, H_res, H_post = torch.zeros(X.shape[:2] + (C,)), torch.zeros(X.shape[:2] + (N, N)), torch.zeros(X.shape[:3])
    for b in range(X.shape[0]):
        for t in range(X.shape[1]):
            x = X[b, t]  # (n, C)
            v = x.reshape(1, N * C)  # vec(x_l) (1, nC)
            v = v / torch.sqrt(v.pow(2).mean() + 1e-20)  # RMSNorm, no weight
            pre = torch.sigmoid(p.alpha_pre * (v @ phi_pre) + p.static_pre)  # (1, n)
            H_post[b, t] = 2 * torch.sigmoid(p.alpha_post * (v @ phi_post) + p.static_post)[0]
            H_res[b, t] = sinkhorn_paper(p.alpha_res * (v @ phi_res).reshape(N, N) + p.static_res)
            x_in[b, t] = (pre @ x)[0]  # H_pre x_l
    y = F_(x_in)  # (B, T, C)
    return torch.einsum("btij,btjc->btic", H_res, X) + H_post[..., None] * y[:, :, None]  # Eq. 3


# ------------------------------------------------------------------ formulas


@pytest.mark.parametrize("k", [0, 1, 5])
def test_hc_init_is_the_papers(k):
    """Eq. 14: A_m = e_(k mod n), A_r = I, B = 1, dynamic weights 0; s_a = s_b = 0.01 (Algorithm 2)."""
    p = DynamicHyperConnection(C, sublayer=k)
    torch.testing.assert_close(p.static_alpha.detach(), torch.cat([torch.eye(N)[:, k % N, None], torch.eye(N)], 1))
    torch.testing.assert_close(p.static_beta.detach(), torch.ones(N))
    assert not p.dynamic_alpha.any() and not p.dynamic_beta.any()
    assert p.alpha_scale.item() == p.beta_scale.item() == pytest.approx(0.01)


@pytest.mark.parametrize("k", [0, 3])
def test_hc_sublayer_is_the_papers_formula(streams, k):
    p = randomized(DynamicHyperConnection(C, sublayer=k), seed=k)
    f = Toy(1)
    torch.testing.assert_close(p(streams, f), hc_paper(p, streams, f))


@pytest.mark.parametrize("layer", [0, 2])
def test_hc_block_is_attention_then_mlp_each_through_its_own_connection(streams, layer):
    b = block("hc", layer)
    assert (b.attn_hc.static_alpha[:, 0].argmax().item(), b.mlp_hc.static_alpha[:, 0].argmax().item()) == (
        2 * layer % N,
        (2 * layer + 1) % N,
    )
    randomized(b.attn_hc, 1), randomized(b.mlp_hc, 2)
    f, g = Toy(1), Toy(2)
    h = hc_paper(b.attn_hc, streams, lambda x: f(ln(b.attn_norm, x)))
    torch.testing.assert_close(b(streams), hc_paper(b.mlp_hc, h, lambda x: g(ln(b.mlp_norm, x))))


def test_mhc_init():
    """b_pre = logit(0.9) on stream k mod n, logit(0.1) elsewhere; b_post = 0; b_res = ln(9 (n-1)) I; a = 0.01."""
    p = ManifoldHyperConnection(C, sublayer=6)
    with torch.no_grad():
        p.phi.zero_()  # the static part alone
    h_pre, h_res, h_post = p.coefficients(torch.randn(1, 1, N, C))
    torch.testing.assert_close(h_pre[0, 0], torch.tensor([0.1, 0.1, 0.9, 0.1]))  # 6 mod 4 = 2
    torch.testing.assert_close(h_post[0, 0], torch.ones(N))
    torch.testing.assert_close(h_res[0, 0], 0.9 * torch.eye(N) + 0.1 / (N - 1) * (1 - torch.eye(N)))
    assert [p.alpha_pre.item(), p.alpha_post.item(), p.alpha_res.item()] == pytest.approx([0.01] * 3)
    assert 0.015 < ManifoldHyperConnection(256, 0).phi.std().item() < 0.025  # N(0, 0.02^2)


@pytest.mark.parametrize("k", [0, 3])
def test_mhc_sublayer_is_the_papers_formula(streams, k):
    p = randomized(ManifoldHyperConnection(C, sublayer=k), seed=k)
    f = Toy(1)
    torch.testing.assert_close(p(streams, f), mhc_paper(p, streams, f))


def test_mhc_block_is_attention_then_mlp_each_through_its_own_connection(streams):
    b = block("mhc", layer=1)
    assert (b.attn_hc.static_pre.argmax().item(), b.mlp_hc.static_pre.argmax().item()) == (2, 3)
    randomized(b.attn_hc, 1), randomized(b.mlp_hc, 2)
    f, g = Toy(1), Toy(2)
    h = mhc_paper(b.attn_hc, streams, lambda x: f(ln(b.attn_norm, x)))
    torch.testing.assert_close(b(streams), mhc_paper(b.mlp_hc, h, lambda x: g(ln(b.mlp_norm, x))))


def test_sinkhorn_is_doubly_stochastic_and_ends_on_rows():
    logits = torch.randn(5, 7, N, N)
    m = sinkhorn_knopp(logits)
    assert (m >= 0).all()
    torch.testing.assert_close(m.sum(-1), torch.ones(5, 7, N), rtol=0, atol=1e-6)  # the last normalization: exact
    torch.testing.assert_close(m.sum(-2), torch.ones(5, 7, N), rtol=0, atol=1e-3)  # after 20 iterations: close
    torch.testing.assert_close(m[2, 3], sinkhorn_paper(logits[2, 3]))
    peaked = sinkhorn_knopp(logits * 3)  # 20 iterations converge slowly here: the columns are only near 1
    torch.testing.assert_close(peaked.sum(-1), torch.ones(5, 7, N), rtol=0, atol=1e-6)
    torch.testing.assert_close(peaked.sum(-2), torch.ones(5, 7, N), rtol=0, atol=0.1)


def test_sinkhorn_leaves_a_doubly_stochastic_matrix_as_it_is_and_survives_large_logits():
    """Large logits, not far apart: exp alone would overflow to inf (and give NaN)."""
    d = torch.tensor([[0.7, 0.2, 0.1, 0.0], [0.1, 0.7, 0.0, 0.2], [0.2, 0.0, 0.6, 0.2], [0.0, 0.1, 0.3, 0.6]])
    torch.testing.assert_close(sinkhorn_knopp(d.clamp_min(1e-30).log()), d)
    logits = torch.randn(N, N)
    assert not torch.isfinite(sinkhorn_paper(logits + 1000)).all()
    torch.testing.assert_close(sinkhorn_knopp(logits + 1000), sinkhorn_knopp(logits))


def test_the_stream_enters_replicated_and_leaves_summed_then_normed():
    stream = PLACEMENTS.get("hc").residual_stream(GPTConfig(**TINY, placement="hc"), make_norm)
    assert type(stream) is HyperStream and type(stream.final_norm) is LayerNorm
    x = torch.randn(2, 3, C)
    X = stream.enter(x)
    assert X.shape == (2, 3, N, C) and all(torch.equal(X[:, :, s], x) for s in range(N))
    X = torch.randn(2, 3, N, C)
    torch.testing.assert_close(stream.exit(X), ln(stream.final_norm, X[:, :, 0] + X[:, :, 1] + X[:, :, 2] + X[:, :, 3]))
    torch.testing.assert_close(stream.residual(X), X.sum(2))  # what the readout reads, for the stream RMS
    torch.testing.assert_close(stream.block_input(X), X.sum(2))


# ------------------------------------------------------------------ the GPT


def test_hc_at_init_is_prenorm_with_n_times_its_stream():
    """At init every stream of HC is pre-norm's stream (given pre-norm's weights), the readout's sum is n times it,
    and the logits are pre-norm's with the final LayerNorm's eps divided by n^2 (LN(n h, eps) = LN(h, eps/n^2))."""
    prenorm, hc = gpt("prenorm"), gpt("hc", seed=1)
    missing, unexpected = hc.load_state_dict(prenorm.state_dict(), strict=False)
    assert not unexpected and missing and all("_hc." in key for key in missing)  # only the connections' own
    seen = {"prenorm": [], "hc": []}
    for name, model in (("prenorm", prenorm), ("hc", hc)):
        for b in model.blocks:
            b.register_forward_hook(lambda m, args, out, name=name: seen[name].append(out))
    idx = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        got, expected = hc(idx)[0], prenorm(idx)[0]
        for h, X in zip(seen["prenorm"], seen["hc"]):
            assert X.shape == (2, 8, N, C) and all(torch.equal(X[:, :, s], h) for s in range(N))
            torch.testing.assert_close(hc.stream.residual(X), N * h)
        assert (got - expected).abs().max() > 1e-6  # the eps: the stream's std is not far above sqrt(eps)
        prenorm.stream.final_norm.eps /= N**2
        torch.testing.assert_close(got, prenorm(idx)[0])


def test_the_streams_stay_equal_under_hc_at_init_and_part_under_mhc():
    """The identical-stream caveat: a replicated embedding stays replicated under HC's init (the backward pass
    separates the streams); mHC's random phi separates them in the first forward pass."""
    idx = torch.randint(0, 64, (2, 8))
    for placement, equal in (("hc", True), ("mhc", False)):
        model, out = gpt(placement), []
        model.blocks[0].register_forward_hook(lambda m, args, o, out=out: out.append(o))
        with torch.no_grad():
            model(idx)
        X = out[0]
        assert all(torch.equal(X[:, :, s], X[:, :, 0]) for s in range(N)) == equal, placement


@pytest.mark.parametrize("placement", ["hc", "mhc"])
def test_forward_and_backward_reach_every_parameter(placement):
    model = gpt(placement)
    idx, tgt = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    _, loss = model(idx, tgt)
    loss.backward()
    assert torch.isfinite(loss)
    # HC's scales multiply tanh(X_n W) with W = 0 at init: no gradient until W moves (the paper's init)
    zero_at_init = {"alpha_scale", "beta_scale"} if placement == "hc" else set()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert (p.grad.abs().sum() > 0) != (name.rsplit(".", 1)[-1] in zero_at_init), name
    if placement == "hc":  # once the dynamic weights have moved, the scales get a gradient too
        for b in model.blocks:
            randomized(b.attn_hc), randomized(b.mlp_hc)
        model.zero_grad()
        model(idx, tgt)[1].backward()
        assert all(torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("placement", ["hc", "mhc"])
def test_bf16_autocast_mixes_the_streams_in_fp32(placement):
    model, out = gpt(placement), []
    model.blocks[0].register_forward_hook(lambda m, args, o: out.append(o))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8)))
    loss.backward()
    assert torch.isfinite(loss) and out[0].dtype == torch.float32
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


# ------------------------------------------------------------------ the composite gain


def test_the_gain_is_nan_before_a_forward_pass_and_exactly_one_for_hc_at_init():
    model = gpt("hc")
    assert all(math.isnan(g.item()) for g in composite_gain(model))
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 8)))
    assert [g.item() for g in composite_gain(model)] == [1.0, 1.0]  # A_r = I in every sublayer


def test_mhc_gain_at_init_is_near_one_with_rows_summing_to_one():
    model = gpt("mhc", n_layer=4)
    with torch.no_grad():
        model(torch.randint(0, 64, (4, 8)))
    for b in model.blocks:
        for mixer in (b.attn_hc, b.mlp_hc):
            torch.testing.assert_close(mixer.res_mean.sum(-1), torch.ones(N), rtol=0, atol=1e-5)
    forward, backward = (g.item() for g in composite_gain(model))
    assert forward == pytest.approx(1.0, abs=1e-5)  # rows of a product of row-stochastic matrices
    assert 1 - 1e-3 <= backward <= 1.6  # columns: near 1 after 20 Sinkhorn iterations (the paper's <= 1.6)


def test_the_gain_composes_the_token_mean_h_res_from_the_input_side(streams):
    """H_res = A_r^T, [target, source], averaged over tokens; P = H_1 H_0 for attention (0) then MLP (1)."""
    b = block("hc")
    randomized(b.attn_hc, 1), randomized(b.mlp_hc, 2)
    f = Toy(1)
    X1 = b.attn_hc(streams, f)
    b.mlp_hc(X1, f)

    def h_res(p, X):  # Eq. 13, token-averaged, transposed to [target, source]
        A_r = p.alpha_scale * torch.tanh(F.layer_norm(X, (C,)) @ p.dynamic_alpha[:, 1:]) + p.static_alpha[:, 1:]
        return A_r.mean((0, 1)).T

    P = (h_res(b.mlp_hc, X1) @ h_res(b.attn_hc, streams)).detach()
    forward, backward = composite_gain(b)
    torch.testing.assert_close(forward, P.sum(1).abs().max())
    torch.testing.assert_close(backward, P.sum(0).abs().max())


def test_the_gain_orientation_one_source_feeding_every_stream():
    """A_r[0, :] = 1, the rest 0: stream 0 sent to every stream. Each stream receives 1 (forward gain 1), stream 0's
    gradient comes back n times (backward gain n)."""
    model = gpt("hc", n_layer=1)
    with torch.no_grad():
        model.blocks[0].attn_hc.static_alpha[:, 1:] = torch.zeros(N, N).index_fill_(0, torch.tensor([0]), 1.0)
        model(torch.randint(0, 64, (2, 8)))
    assert [g.item() for g in composite_gain(model)] == [1.0, float(N)]


def test_the_gain_refuses_a_model_without_hyper_connections():
    with pytest.raises(ValueError, match="placement hc or mhc"):
        composite_gain(gpt("prenorm"))
    with pytest.raises(ValueError, match="placement hc or mhc"):
        with recorded_mixes(gpt("prenorm")):
            pass


def test_the_per_token_gain_composes_each_tokens_own_h_res(streams):
    """mHC's Fig. 3: P_t = H_1(t) H_0(t) for each token t from its own H_res (Eq. 13, transposed to [target,
    source]), the largest |row sum| and |column sum| of each, computed here token by token."""
    b = block("hc")
    randomized(b.attn_hc, 1), randomized(b.mlp_hc, 2)
    f = Toy(1)
    with recorded_mixes(b) as mixes:
        X1 = b.attn_hc(streams, f)
        b.mlp_hc(X1, f)
    assert [m.shape for m in mixes] == [(2, 3, N, N)] * 2
    assert "coefficients" not in vars(b.attn_hc)  # the recording is gone after the with: the class's method again

    def h_res(p, X):  # Eq. 13 per token, [target, source]: (B, T, n, n)
        A_r = p.alpha_scale * torch.tanh(F.layer_norm(X, (C,)) @ p.dynamic_alpha[:, 1:]) + p.static_alpha[:, 1:]
        return A_r.transpose(-1, -2).detach().double()

    H0, H1 = h_res(b.attn_hc, streams), h_res(b.mlp_hc, X1)
    gain = token_composite_gain(mixes)
    for i in range(2):
        for t in range(3):
            P = H1[i, t] @ H0[i, t]
            assert gain.forward[i, t].item() == pytest.approx(max(abs(P[r].sum().item()) for r in range(N)), rel=1e-5)
            assert gain.backward[i, t].item() == pytest.approx(
                max(abs(P[:, c].sum().item()) for c in range(N)), rel=1e-5
            )


def test_the_per_token_gain_differs_from_the_token_mean_one_where_the_mixes_depend_on_the_token():
    """Two tokens, one sublayer: H = diag(2, 0, 0, 0) and diag(0, 2, 0, 0). Each token's gain is 2 both ways; the
    mean H is diag(1, 1, 0, 0), whose gain is 1."""
    h = torch.zeros(1, 2, N, N)
    h[0, 0, 0, 0], h[0, 1, 1, 1] = 2.0, 2.0
    per_token = token_composite_gain([h])
    assert per_token.forward.tolist() == [[2.0, 2.0]] and per_token.backward.tolist() == [[2.0, 2.0]]
    assert [g.item() for g in amax_gain(composed([h.mean((0, 1))]))] == [1.0, 1.0]
    with pytest.raises(ValueError, match="at least one sublayer"):
        token_composite_gain([])


def test_the_gain_from_each_sublayer_composes_its_suffix_per_token():
    """mHC's Fig. 3(b): for each l, H_res[L-1] ... H_res[l] per token; l = 0 is the whole stack."""
    g = torch.Generator().manual_seed(0)
    mixes = [torch.randn(2, 3, N, N, generator=g) for _ in range(3)]  # three sublayers, token-dependent
    gains = token_gains_from_each_sublayer(mixes)
    assert len(gains) == 3
    for l in range(3):
        for i in range(2):
            for t in range(3):
                P = torch.eye(N, dtype=torch.float64)
                for h in mixes[l:]:
                    P = h[i, t].double() @ P
                assert gains[l].forward[i, t].item() == pytest.approx(P.sum(1).abs().max().item())
                assert gains[l].backward[i, t].item() == pytest.approx(P.sum(0).abs().max().item())
    whole = token_composite_gain(mixes)
    torch.testing.assert_close(gains[0].forward, whole.forward)
    torch.testing.assert_close(gains[0].backward, whole.backward)
    with pytest.raises(ValueError, match="at least one sublayer"):
        token_gains_from_each_sublayer([])


@pytest.mark.parametrize("placement", ["hc", "mhc"])
def test_recording_the_mixes_changes_nothing_and_keeps_one_per_sublayer(placement):
    model = gpt(placement, n_layer=3)
    for b in model.blocks:
        randomized(b.attn_hc, 1), randomized(b.mlp_hc, 2)
    idx = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        expected = model(idx)[0]
        with recorded_mixes(model) as mixes:
            got = model(idx)[0]
        model(idx)  # after the with, nothing is recorded
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert len(mixes) == 6 and all(m.shape == (2, 8, N, N) and m.dtype == torch.float32 for m in mixes)
    torch.testing.assert_close(mixes[-1].mean((0, 1)), model.blocks[-1].mlp_hc.res_mean)
    forward, backward = token_composite_gain(mixes)
    if placement == "mhc":  # every token's H_res has rows summing to 1, and so has their product
        torch.testing.assert_close(forward, torch.ones(2, 8, dtype=torch.float64))
    assert (backward > 0).all()


# ------------------------------------------------------------------ lucidrains' hyper-connections (PyPI 0.4.11)


def lucidrains_hc(ours: DynamicHyperConnection, k: int):
    """lucidrains' ``HyperConnections`` for sublayer k, with our weights (the same names, the same [source,
    target] orientation)."""
    hc = pytest.importorskip("hyper_connections")
    ref = hc.HyperConnections(N, dim=C, layer_index=k)
    with torch.no_grad():
        ref.static_alpha.copy_(ours.static_alpha)
        ref.dynamic_alpha_fn.copy_(ours.dynamic_alpha)
        ref.dynamic_alpha_scale.copy_(ours.alpha_scale)
        ref.static_beta.copy_(ours.static_beta)
        ref.dynamic_beta_fn.copy_(ours.dynamic_beta)
        ref.dynamic_beta_scale.copy_(ours.beta_scale)
    return ref


def run_lucidrains(ref, X: torch.Tensor, f) -> torch.Tensor:
    """Its streams are folded into the batch, ``(b s) t d``; ours are (B, T, n, C)."""
    B, T = X.shape[:2]
    branch_input, add_residual = ref(X.transpose(1, 2).reshape(B * N, T, C))
    return add_residual(f(branch_input)).reshape(B, N, T, C).transpose(1, 2)


@pytest.mark.parametrize("k", [0, 1, 5])
def test_lucidrains_hc_inits_as_ours(k):
    ours = DynamicHyperConnection(C, sublayer=k)
    ref = pytest.importorskip("hyper_connections").HyperConnections(N, dim=C, layer_index=k)
    for mine, theirs in (
        (ours.static_alpha, ref.static_alpha),
        (ours.dynamic_alpha, ref.dynamic_alpha_fn),
        (ours.alpha_scale, ref.dynamic_alpha_scale),
        (ours.static_beta, ref.static_beta),
        (ours.dynamic_beta, ref.dynamic_beta_fn),
        (ours.beta_scale, ref.dynamic_beta_scale),
    ):
        torch.testing.assert_close(mine.detach(), theirs.detach())


@pytest.mark.parametrize("k", [0, 1, 5])
def test_lucidrains_hc_with_the_papers_layernorm_computes_ours(streams, k):
    """lucidrains normalizes the dynamic weights' input by an RMSNorm ("they used layernorm in paper"): given the
    paper's LayerNorm, non-parametric as ours, it computes what ours does, every term non-trivial."""
    ours = randomized(DynamicHyperConnection(C, sublayer=k), seed=k)
    ref = lucidrains_hc(ours, k)
    ref.norm = nn.LayerNorm(C, eps=ours.eps, elementwise_affine=False)
    f = Toy(1)
    torch.testing.assert_close(run_lucidrains(ref, streams, f), ours(streams, f))


def test_lucidrains_hc_with_its_own_rmsnorm_agrees_where_the_streams_have_zero_mean(streams):
    """Where each stream has zero mean over C, LayerNorm is RMSNorm (up to eps/var, ~1e-6 here): lucidrains' own
    norm, untouched (its gain starts at 1), gives our output."""
    X = streams - streams.mean(-1, keepdim=True)
    ours = randomized(DynamicHyperConnection(C, sublayer=2), seed=3)
    ref = lucidrains_hc(ours, 2)
    f = Toy(1)
    torch.testing.assert_close(run_lucidrains(ref, X, f), ours(X, f), rtol=1e-4, atol=1e-5)


def test_lucidrains_expands_by_replicating_and_reduces_by_summing_as_ours():
    hc = pytest.importorskip("hyper_connections")
    expand, reduce = hc.get_expand_reduce_stream_functions(N)
    stream = HyperStream(GPTConfig(**TINY, placement="hc"), [])  # no final norm: the sum alone
    x = torch.randn(2, 3, C)
    X = stream.enter(x)
    torch.testing.assert_close(X.transpose(1, 2).reshape(2 * N, 3, C), expand(x))
    torch.testing.assert_close(stream.exit(X), reduce(expand(x)))


def test_a_training_run_logs_the_gain_and_leaves_the_static_parts_undecayed(recipe_run):
    """hc-12l's metrics.csv has the composite gain of every logged step beside the other diagnostics, and the
    optimizer decays HC's dynamic matrices but not its static ones (the HC paper, section 4)."""
    from resnorm_lm.train.optim import parameter_groups
    from resnorm_lm.train.runs import RunDir

    rows = [r for r in RunDir(recipe_run("hc-12l")).metrics() if "hc/gain_forward" in r]
    assert rows and rows[0]["step"] == 0 and rows[0]["hc/gain_forward"] == pytest.approx(1.0)  # at init: identity
    assert all(r["readout/mean_rms"] > 0 and r["readout/rest_rms"] > 0 for r in rows)
    model = GPT(GPTConfig(**TINY, placement="hc"))
    decayed = {id(p) for p in parameter_groups(model, 0.1)[0]["params"]}
    for name, p in model.named_parameters():
        if name.endswith(("static_alpha", "static_beta")):
            assert id(p) not in decayed, name
        if name.endswith("dynamic_alpha"):
            assert id(p) in decayed, name

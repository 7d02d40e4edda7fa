"""Hyper-connections: n residual streams that each sublayer reads from, mixes and writes to (``hc``, ``mhc``).

Every sublayer (the attention and the MLP each) gets a small module that reads a weighted sum of the n streams as
its input, mixes the streams among themselves and adds its output back to each with a weight. In the mHC paper's
notation (arXiv 2512.24880, Eq. 3), X (n, C) the n streams of one token and F the sublayer with its pre-norm::

    X' = H_res X + H_post^T F(H_pre X)        H_pre, H_post (1, n);  H_res (n, n)

Orientation: H_res is [target, source] (row i says what stream i receives) everywhere outside
``DynamicHyperConnection``, which keeps the HC paper's own [source, target] A_r and transposes it once.

The stream enters as the embeddings replicated n times and leaves as their sum, then the final norm (HC §2.1).
``composite_gain`` is mHC's "Amax Gain Magnitude" (§3.1) of the H_res of the last forward pass, each averaged
over its tokens before they are composed (what training logs); ``token_composite_gain`` composes each token's own
H_res and averages the gains over the tokens afterwards, as the paper's Fig. 3 does (``recorded_mixes`` keeps them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from resnorm_lm.model.block import Block, MakeNorm, ResidualStream
from resnorm_lm.model.placements import PLACEMENTS

STREAMS = 4  # n: both papers' main setting (HC's expansion rate 4; mHC Table 5)
SINKHORN_ITERS = 20  # mHC Table 5's t_max


GAIN_FORWARD = "hc/gain_forward"  # metrics.csv columns: composite_gain of the last training forward pass
GAIN_BACKWARD = "hc/gain_backward"


class HyperStream(ResidualStream):
    """n residual streams (B, T, n, C) between the embeddings and the LM head::

        enter:  x ──> (x, x, ..., x)                 (B, T, C) -> (B, T, n, C): HC's H^0, the embeddings n times
        exit:   X ──> sum over n ──> final_norm ──>  (B, T, n, C) -> (B, T, C): HC's readout

    ``residual`` (the stream RMS) and ``block_input`` (layer contribution) read the sum over streams, what the
    readout reads. While the streams are equal (HC at init) each is pre-norm's stream and the sum n times it, so
    the final LayerNorm (or RMSNorm) of the sum is pre-norm's with its eps divided by n^2.
    """

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        x = super().enter(x)  # (B, T, C)
        return x.unsqueeze(2).expand(-1, -1, STREAMS, -1)  # (B, T, n, C): n views of one tensor

    def exit(self, stream: torch.Tensor) -> torch.Tensor:
        return self.final_norm(stream.sum(2))  # (B, T, C)

    @staticmethod
    def residual(stream: torch.Tensor) -> torch.Tensor:
        return stream.sum(2)  # (B, T, C)

    def diagnostics(self) -> dict[str, torch.Tensor]:
        """The composite gain of the stream mixes (``composite_gain``), logged as training goes."""
        gain = composite_gain(self)
        return {GAIN_FORWARD: gain.forward, GAIN_BACKWARD: gain.backward}

    @staticmethod
    def block_input(stream: torch.Tensor) -> torch.Tensor:
        return stream.sum(2)  # (B, T, C)


class StreamMixer(nn.Module):
    """One sublayer's connection to the n streams: ``coefficients`` are the design's, the mix is common::

        X' = H_res X + H_post^T F(H_pre X)

        X ──┬──> H_pre X ──> F ──> * H_post ──(+)──> X'
            └──> H_res X ─────────────────────┘

    Coefficients are computed in fp32 and the streams mixed in their own precision, outside autocast: a bf16
    matmul would round the residual streams at every sublayer, which pre-norm's add never does. ``res_mean``
    keeps the last forward pass's H_res averaged over its tokens (B, T) for ``composite_gain``; NaN before one.
    """

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("res_mean", torch.full((STREAMS, STREAMS), math.nan), persistent=False)

    def coefficients(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, n, C) fp32 -> H_pre (B, T, n), H_res (B, T, n, n) [target, source], H_post (B, T, n)."""
        raise NotImplementedError

    def forward(self, streams: torch.Tensor, branch: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """streams (B, T, n, C); ``branch`` the sublayer with its pre-norm, (B, T, C) -> (B, T, C)."""
        with torch.autocast(streams.device.type, enabled=False):
            h_pre, h_res, h_post = self.coefficients(streams.float())  # fp32
            with torch.no_grad():
                self.res_mean.copy_(h_res.mean((0, 1)))  # (n, n)
            h_pre, h_res, h_post = (h.to(streams.dtype) for h in (h_pre, h_res, h_post))
            x = torch.einsum("btj,btjc->btc", h_pre, streams)  # (B, T, C): H_pre X
            mixed = torch.einsum("btij,btjc->btic", h_res, streams)  # (B, T, n, C): H_res X
        return mixed + h_post.unsqueeze(-1) * branch(x).unsqueeze(2)  # (B, T, n, C)


class DynamicHyperConnection(StreamMixer):
    """Dynamic hyper-connections of sublayer k (Zhu et al. 2025, ICLR, arXiv 2409.19606, Eqs. 10-14), in that
    paper's orientation: A = [A_m | A_r] (n, 1 + n) indexed [source stream, output], B (n,)::

        X_n = LN(X)                                        per stream over C, without weight or bias
        A   = s_a * tanh(X_n W_a) + [e_(k mod n) | I_n]    W_a (C, 1 + n) = 0 at init, s_a = 0.01
        B   = s_b * tanh(X_n w_b) + 1                      w_b (C,) = 0 at init, s_b = 0.01
        x = A_m^T X;   X' = A_r^T X + B^T F(x)             (H_pre = A_m^T, H_res = A_r^T, H_post = B)

    The LayerNorm is the paper's, non-parametric as in its dense OLMo models ("|theta_norm| = 0"): a weight would
    only rescale the rows of W_a and w_b. At init A_m picks stream k mod n, A_r is the identity and B is 1: every
    stream is pre-norm's. Not here: the paper's sqrt(n) rescaling of the output projections' init (§4), whose
    direction it does not state and which neither reference library (lucidrains' hyper-connections,
    x-transformers) applies.
    """

    eps = 1e-5  # the dynamic weights' LayerNorm: torch's default, not the configured norm's

    def __init__(self, dim: int, sublayer: int) -> None:
        super().__init__()
        n = STREAMS
        select = F.one_hot(torch.tensor(sublayer % n), n).float().unsqueeze(1)  # (n, 1): e_(k mod n)
        self.static_alpha = nn.Parameter(torch.cat([select, torch.eye(n)], dim=1))  # (n, 1 + n)
        self.dynamic_alpha = nn.Parameter(torch.zeros(dim, 1 + n))  # W_a = [W_m | W_r]
        self.alpha_scale = nn.Parameter(torch.tensor(0.01))  # s_a, shared by A_m and A_r
        self.static_beta = nn.Parameter(torch.ones(n))
        self.dynamic_beta = nn.Parameter(torch.zeros(dim))  # w_b
        self.beta_scale = nn.Parameter(torch.tensor(0.01))  # s_b

    def coefficients(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xn = F.layer_norm(x, x.shape[-1:], eps=self.eps)  # (B, T, n, C)
        a = self.alpha_scale.float() * torch.tanh(xn @ self.dynamic_alpha.float()) + self.static_alpha.float()
        b = self.beta_scale.float() * torch.tanh(xn @ self.dynamic_beta.float()) + self.static_beta.float()
        return a[..., 0], a[..., 1:].transpose(-1, -2), b  # a (B, T, n, 1 + n), b (B, T, n)


class ManifoldHyperConnection(StreamMixer):
    """Manifold-constrained hyper-connections of sublayer k (DeepSeek-AI 2025, arXiv 2512.24880, Eqs. 7-9)::

        x_n    = RMSNorm(vec(X))                                 (n C,): all streams at once, no weight
        z      = x_n phi                                         phi (n C, n^2 + 2n): [pre | post | res]
        H_pre  = sigmoid(a_pre z_pre + b_pre)                    (n,)
        H_post = 2 sigmoid(a_post z_post + b_post)               (n,)
        H_res  = SinkhornKnopp(a_res mat(z_res) + b_res)         (n, n) doubly stochastic, mat row-major

    Gates a = 0.01 and the RMSNorm's eps 1e-20 (Table 5). The paper gives neither b nor phi; here, near HC's
    init (so near pre-norm) yet trainable:

    - b_pre = logit(0.9) on stream k mod n, logit(0.1) on the others: HC's one-hot A_m, softened;
    - b_post = 0: H_post = 1, HC's B and pre-norm's plain add;
    - b_res = ln(9 (n - 1)) I: H_res = 0.9 I + 0.1 / (n - 1) off the diagonal, already doubly stochastic.
      The identity HC starts at needs infinite logits, and logits far apart (-8 off the diagonal) are reported
      to leave H_res stuck (tokenbender/mHC, issue 2);
    - phi ~ N(0, 0.02^2), GPT-2's std for a Linear (DeepSeek-V4's Hugging Face port inits it so), not zero. The
      streams enter equal, and a row-stochastic H_res with an equal H_post keeps them equal: with phi = 0 only the
      backward pass (through the one-hot-ish H_pre) would set them apart, and the gates a would get no gradient
      until phi moved. A random phi gives each stream its own H_post and H_res row from the first step; its
      share of the logits at init is a z of std 0.02 sqrt(nC) times a = 0.01, under 0.01 for nC = 1024.

    The b's are ``static_*`` as in HC. Sinkhorn's 20 iterations are kept for backward, ~40 (B, T, n, n)
    tensors per sublayer; the paper recomputes them in its kernel instead.
    """

    eps = 1e-20

    def __init__(self, dim: int, sublayer: int) -> None:
        super().__init__()
        n = STREAMS
        self.phi = nn.Parameter(torch.randn(n * dim, n * n + 2 * n) * 0.02)
        self.alpha_pre = nn.Parameter(torch.tensor(0.01))
        self.alpha_post = nn.Parameter(torch.tensor(0.01))
        self.alpha_res = nn.Parameter(torch.tensor(0.01))
        select = F.one_hot(torch.tensor(sublayer % n), n).bool()
        self.static_pre = nn.Parameter(torch.where(select, math.log(0.9 / 0.1), math.log(0.1 / 0.9)))
        self.static_post = nn.Parameter(torch.zeros(n))
        self.static_res = nn.Parameter(torch.eye(n) * math.log(9 * (n - 1)))

    def coefficients(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = STREAMS
        xn = F.rms_norm(x.flatten(-2), (x.shape[-2] * x.shape[-1],), eps=self.eps)  # (B, T, nC)
        z = xn @ self.phi.float()  # (B, T, n^2 + 2n)
        h_pre = torch.sigmoid(self.alpha_pre.float() * z[..., :n] + self.static_pre.float())
        h_post = 2 * torch.sigmoid(self.alpha_post.float() * z[..., n : 2 * n] + self.static_post.float())
        z_res = z[..., 2 * n :].unflatten(-1, (n, n))  # (B, T, n, n): mat(), row-major
        h_res = sinkhorn_knopp(self.alpha_res.float() * z_res + self.static_res.float())
        return h_pre, h_res, h_post


def sinkhorn_knopp(logits: torch.Tensor, iters: int = SINKHORN_ITERS) -> torch.Tensor:
    """A doubly stochastic matrix from logits (..., n, n), mHC's Eq. 9: M = exp(logits), then ``iters`` times a
    column normalization followed by a row normalization; rows sum to 1 exactly, columns nearly."""
    m = (logits - logits.amax(-2, keepdim=True).detach()).exp()  # a factor per column, which T_c removes: no overflow
    for _ in range(iters):
        m = m / m.sum(-2, keepdim=True)  # T_c: each column sums to 1
        m = m / m.sum(-1, keepdim=True)  # T_r: each row sums to 1
    return m


@PLACEMENTS.register("hc")
class HyperConnections(Block):
    """Dynamic hyper-connections (Zhu et al. 2025, ICLR, arXiv 2409.19606): n = 4 streams, and per sublayer k
    (2 l the attention of block l, 2 l + 1 its MLP) a ``DynamicHyperConnection`` around the pre-norm sublayer::

        x = H_pre X;   X' = H_res X + H_post^T F(LN(x))       X (n, C): the n streams of a token

        X ──┬──> H_pre ──> LN ──> F ──> * H_post ──(+)──> X'
            └──> H_res ────────────────────────────┘

    The stream is n copies of the embeddings, summed before the final LN (``HyperStream``). GPT-2's depth init.
    """

    names_norm_roles = True
    connection: type[StreamMixer] = DynamicHyperConnection

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.attn_norm, self.mlp_norm = make_norm(role="attention"), make_norm(role="mlp")
        self.attn_hc = self.connection(cfg.n_embd, sublayer=2 * layer)
        self.mlp_hc = self.connection(cfg.n_embd, sublayer=2 * layer + 1)

    @classmethod
    def residual_stream(cls, cfg, make_norm: MakeNorm) -> ResidualStream:
        return HyperStream(cfg, cls.blocks(cfg, make_norm), final_norm=make_norm(role="final"))

    def forward(self, streams: torch.Tensor) -> torch.Tensor:  # (B, T, n, C)
        streams = self.attn_hc(streams, lambda x: self.attn(self.attn_norm(x)))  # X = H_res X + H_post Attn(LN(x))
        return self.mlp_hc(streams, lambda x: self.mlp(self.mlp_norm(x)))  # X = H_res X + H_post MLP(LN(x))


@PLACEMENTS.register("mhc")
class ManifoldHyperConnections(HyperConnections):
    """Manifold-constrained hyper-connections (DeepSeek-AI 2025, arXiv 2512.24880): HC's wiring with H_res
    doubly stochastic (Sinkhorn-Knopp), H_pre and H_post sigmoid gates, from a ``ManifoldHyperConnection``::

        x = H_pre X;   X' = H_res X + H_post^T F(LN(x)),   H_res 1 = 1, 1^T H_res = 1^T, H_res >= 0

        X ──┬──> H_pre ──> LN ──> F ──> * H_post ──(+)──> X'
            └──> H_res ────────────────────────────┘

    The paper leaves stream creation and readout to HC's: replicate, and sum before the final LN.
    """

    connection = ManifoldHyperConnection


class Gain(NamedTuple):
    forward: torch.Tensor  # () or (B, T): max_i |sum_j P_ij|, the largest absolute row sum of P
    backward: torch.Tensor  # () or (B, T): max_j |sum_i P_ij|, the largest absolute column sum of P


def composite_gain(model: nn.Module) -> Gain:
    """mHC's Amax Gain Magnitude (arXiv 2512.24880, §3.1) of the whole stack, from the last forward pass's H_res
    of every sublayer, each averaged over that pass's tokens: P = H_res[L-1] ... H_res[1] H_res[0], L = 2
    n_layer sublayers from the input side, H_res [target, source] (X' = H_res X). The forward gain is P's largest
    absolute row sum (what a stream can receive), the backward gain its largest absolute column sum (what one
    sends on). HC's H_res = A_r^T has any sign and P can grow; mHC's is doubly stochastic, P too, and both stay
    near 1. Device tensors, no sync. NaN before the first forward pass."""
    return amax_gain(composed([mixer.res_mean.float() for mixer in stream_mixers(model, "composite_gain")]))  # ()


def stream_mixers(model: nn.Module, needed_by: str) -> list[StreamMixer]:
    """The model's stream mixers, block by block, the attention's before the MLP's; ValueError without any."""
    mixers = [m for m in model.modules() if isinstance(m, StreamMixer)]
    if not mixers:
        raise ValueError(f"{needed_by} needs a model with hyper-connections (placement hc or mhc)")
    return mixers


def composed(mixes: Sequence[torch.Tensor]) -> torch.Tensor:
    """P = H[L-1] ... H[1] H[0] of H_res (..., n, n) [target, source] in the order the sublayers ran, in their
    dtype: (..., n, n)."""
    p = torch.eye(STREAMS, dtype=mixes[0].dtype, device=mixes[0].device).expand(mixes[0].shape)
    for h_res in mixes:
        p = h_res @ p
    return p


def amax_gain(p: torch.Tensor) -> Gain:
    """The largest absolute row sum (forward) and column sum (backward) of P (..., n, n): (...) each."""
    return Gain(p.sum(-1).abs().amax(-1), p.sum(-2).abs().amax(-1))


@contextmanager
def recorded_mixes(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Inside the ``with``, every sublayer's H_res (B, T, n, n) [target, source], fp32 and detached, appended in the
    order the sublayers run, one per sublayer and forward pass; the model computes what it computes without."""
    mixers = stream_mixers(model, "recorded_mixes")
    mixes: list[torch.Tensor] = []

    def recording(compute: Callable) -> Callable:
        def coefficients(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            h_pre, h_res, h_post = compute(x)
            mixes.append(h_res.detach())
            return h_pre, h_res, h_post

        return coefficients

    for mixer in mixers:
        mixer.coefficients = recording(mixer.coefficients)  # an instance attribute shadows the class's method
    try:
        yield mixes
    finally:
        for mixer in mixers:
            del mixer.coefficients


def token_composite_gain(mixes: Sequence[torch.Tensor]) -> Gain:
    """mHC's Amax Gain Magnitude per token, as the paper's Fig. 3 computes it ("averaged over all tokens" after):
    each token's own P = H_res[L-1] ... H_res[0] from the sublayers' H_res (B, T, n, n) in the order they ran (one
    forward pass of ``recorded_mixes``), composed in fp64, its largest absolute row sum (forward) and column sum
    (backward), (B, T) each. ``composite_gain`` composes the token-averaged H_res instead: the two agree where the
    mixes do not depend on the token (mHC's rows always sum to 1: its forward gain is 1 either way)."""
    if not mixes:
        raise ValueError("token_composite_gain needs the H_res of at least one sublayer (see recorded_mixes)")
    return amax_gain(composed([h_res.double() for h_res in mixes]))  # (B, T) each


def token_gains_from_each_sublayer(mixes: Sequence[torch.Tensor]) -> list[Gain]:
    """The per-token gain of the composite from each sublayer l to the end, H_res[L-1] ... H_res[l], for l = 0 ..
    L-1: mHC's Fig. 3(b), whose x-axis is l (its peak of about 3000 for HC is over l). Element 0 is
    ``token_composite_gain``; (B, T) each, fp64."""
    if not mixes:
        raise ValueError("token_gains_from_each_sublayer needs the H_res of at least one sublayer")
    q = torch.eye(STREAMS, dtype=torch.float64, device=mixes[0].device).expand(mixes[0].shape)  # (B, T, n, n)
    gains = []
    for h_res in reversed(mixes):
        q = q @ h_res.double()  # H_res[L-1] ... H_res[l]
        gains.append(amax_gain(q))
    return gains[::-1]

"""The residual / normalization placements, by name: where the norm sits around each sublayer.

A placement is the residual wiring of one transformer block (two sublayers:
attention, then MLP). It owns its norms and learnable scalars, says how the
residual stream starts (``embed``) and how it is read out before the LM head
(``build_readout``), and may define its own weight init (``init_sublayers``):
``placement_base.py`` holds what every placement offers. ``Block`` and ``GPT``
never change when a placement is added: write one class here and register it.
Each class gives its formula, a diagram and the paper it follows (authors,
year, arXiv id); ``F`` is a sublayer, ``LN`` the configured norm, ``N`` the
number of blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from resnorm_lm.model.init import InitRule
from resnorm_lm.model.norms import Norm
from resnorm_lm.model.placement_base import (
    BlockContext,
    FinalOutputIsNormed,
    Placement,
    Stream,
    Sublayer,
    SublayerPlacement,
)
from resnorm_lm.registry import Registry

PLACEMENTS: Registry[type[Placement]] = Registry("placement")


@PLACEMENTS.register("postnorm")
class PostNorm(FinalOutputIsNormed, SublayerPlacement):
    """Post-LN, the original "Add & Norm" (Vaswani et al. 2017, arXiv 1706.03762)::

        x = LN(x + F(x))

        x ──┬──> F ──(+)──> LN ──>
            └────────┘

    No final norm: the stream is already normalized. Needs LR warmup (Xiong et al. 2020, arXiv 2002.04745).
    """

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self.norms = nn.ModuleList([ctx.make_norm(), ctx.make_norm()])

    def step(self, x: torch.Tensor, f: Sublayer, i: int) -> torch.Tensor:
        return self.norms[i].add_norm(x, f(x)).normed


@PLACEMENTS.register("prenorm")
class PreNorm(Placement):
    """Pre-LN, as in GPT-2 (Radford et al. 2019; analysed by Xiong et al. 2020, arXiv 2002.04745)::

        x = x + F(LN(x))

        x ──┬──> LN ──> F ──(+)──>
            └───────────────┘

    A final LN before the LM head.
    """

    names_norm_roles = True

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self.norms = nn.ModuleList([ctx.make_norm(role="attention"), ctx.make_norm(role="mlp")])

    def forward(self, x: torch.Tensor, sublayers: Sequence[Sublayer]) -> torch.Tensor:
        attn, mlp = sublayers
        a = attn(self.norms[0](x))
        x, h = self.norms[1].add_norm(x, a)  # x = x + a;  h = LN_1(x): one fused pass on the triton backend
        return x + mlp(h)


@PLACEMENTS.register("sandwich")
class Sandwich(Placement):
    """Sandwich (CogView: Ding et al. 2021, arXiv 2105.13290), or Peri-LN (Kim et al. 2025, arXiv 2502.02732)::

        x = x + LN_out(F(LN_in(x)))

        x ──┬──> LN_in ──> F ──> LN_out ──(+)──>
            └──────────────────────────────┘

    A final LN before the LM head.
    """

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self.norms_in = nn.ModuleList([ctx.make_norm(), ctx.make_norm()])
        self.norms_out = nn.ModuleList([ctx.make_norm(), ctx.make_norm()])

    def forward(self, x: torch.Tensor, sublayers: Sequence[Sublayer]) -> torch.Tensor:
        attn, mlp = sublayers
        a = self.norms_out[0](attn(self.norms_in[0](x)))
        x, h = self.norms_in[1].add_norm(x, a)  # x = x + a;  h = LN_in(x), fused
        return x + self.norms_out[1](mlp(h))


@PLACEMENTS.register("peri_ln")
class PeriLN(Sandwich):
    """Peri-LN with its optional embedding norm (Kim et al. 2025, arXiv 2502.02732, as an option: ``y_0 =
    Norm(x_embed)``), so the first block's stream starts at unit RMS like the normed sublayer outputs added to it
    (the embeddings alone are at std 0.02 under GPT-2's init)::

        x_0 = LN_emb(embeddings);   x = x + LN_out(F(LN_in(x)))

        emb ──> LN_emb ──┬──> LN_in ──> F ──> LN_out ──(+)──> ...
                         └──────────────────────────────┘
    """

    @classmethod
    def build_embedding_norm(cls, make_norm: Callable[[], Norm]) -> nn.Module:
        return make_norm()


@PLACEMENTS.register("deepnorm")
class DeepNorm(FinalOutputIsNormed, SublayerPlacement):
    """DeepNorm (DeepNet: Wang et al. 2022, arXiv 2203.00555), decoder-only constants::

        x = LN(alpha * x + F(x)),   alpha = (2N)^(1/4)

        x ──┬──> F ─────────(+)──> LN ──>
            └──> * alpha ────┘

    Init: the MLP, attention value and attention output weights and biases are
    multiplied by beta = (8N)^(-1/4) (a divisor of whatever the init set, as
    torchscale divides its Xavier init; not a gain on the output), in place of
    the init's depth rule. Alpha scales the residual, not F. No final norm.
    """

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self.norms = nn.ModuleList([ctx.make_norm(), ctx.make_norm()])
        self.alpha = self.residual_scale(ctx.n_layer)
        self.beta = self.init_scale(ctx.n_layer)

    @staticmethod
    def residual_scale(n_layer: int) -> float:
        return (2 * n_layer) ** 0.25

    @staticmethod
    def init_scale(n_layer: int) -> float:
        return (8 * n_layer) ** -0.25

    def step(self, x: torch.Tensor, f: Sublayer, i: int) -> torch.Tensor:
        return self.norms[i].add_norm(self.alpha * x, f(x)).normed

    def init_sublayers(self, attn: nn.Module, mlp: nn.Module, init: InitRule) -> None:
        with torch.no_grad():
            attn.value_weight().mul_(self.beta)  # (C, C) slice of the fused qkv weight
            if attn.c_attn.bias is not None:
                attn.c_attn.bias[2 * attn.n_embd :].mul_(self.beta)  # v's bias
            for linear in (attn.c_proj, mlp.c_fc, mlp.c_proj):
                linear.weight.mul_(self.beta)
                if linear.bias is not None:
                    linear.bias.mul_(self.beta)


@PLACEMENTS.register("rezero")
class ReZero(SublayerPlacement):
    """ReZero (Bachlechner et al. 2020, arXiv 2003.04887): no norm at all, a zero-initialised gate per sublayer::

        x = x + a * F(x),   a = 0 at init

        x ──┬──> F ──> * a ──(+)──>
            └─────────────────┘

    At init every block is the identity. No final norm either: the stream is not normalized, there is no norm
    anywhere, and the config's norm settings are refused (``has_norms``).
    """

    has_norms = False
    n_gates = 2  # one scalar a per sublayer

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self.gates = nn.Parameter(torch.zeros(self.n_gates))

    @classmethod
    def build_readout(cls, make_norm: Callable[[], Norm]) -> nn.Module:
        return nn.Identity()

    def step(self, x: torch.Tensor, f: Sublayer, i: int) -> torch.Tensor:
        return x + self.gates[i % self.n_gates] * f(x)


@PLACEMENTS.register("rezero_shared")
class ReZeroShared(ReZero):
    """ReZero as its reference code has it (majumderb/rezero, ``rztx.py``: one ``resweight`` per layer): one gate
    shared by a block's attention and MLP::

        x = x + a * Attn(x);   x = x + a * MLP(x),   a = 0 at init

        x ──┬──> F ──> * a ──(+)──>     (the same a for both sublayers)
            └─────────────────┘
    """

    n_gates = 1  # one scalar a per block


@PLACEMENTS.register("mixln")
class MixLN(Placement):
    """Mix-LN (Li et al. 2024, arXiv 2412.13795): post-norm in the first blocks, pre-norm after::

        block l < floor(r * N):  x = LN(x + F(x))      (PostNorm)
        block l >= floor(r * N): x = x + F(LN(x))      (PreNorm)

        embed ──> [Post] x floor(rN) ──> [Pre] x (N - floor(rN)) ──> LN ──> head

    r = 0.25 as in the paper; the switch is per block (both sublayers of a
    block share a placement). A final LN, since the last blocks are pre-norm.
    """

    post_fraction = 0.25

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self.n_post = math.floor(self.post_fraction * ctx.n_layer)
        inner = PostNorm if ctx.layer < self.n_post else PreNorm
        self.inner = inner(ctx)

    def forward(self, stream: torch.Tensor, sublayers: Sequence[Sublayer]) -> torch.Tensor:
        return self.inner(stream, sublayers)


@PLACEMENTS.register("lns")
class LayerNormScaling(Placement):
    """LayerNorm Scaling (Sun et al. 2025, arXiv 2502.05795): pre-norm with the norm output scaled by depth::

        x = x + F(LN(x) / sqrt(l)),   l = 1-based block index

        x ──┬──> LN ──> / sqrt(l) ──> F ──(+)──>
            └──────────────────────────────┘

    A final LN. The GPT-2 depth-scaled init is dropped, as the paper says.
    """

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self.norms = nn.ModuleList([ctx.make_norm(), ctx.make_norm()])
        self.scale = 1.0 / math.sqrt(ctx.layer + 1)

    def forward(self, x: torch.Tensor, sublayers: Sequence[Sublayer]) -> torch.Tensor:
        attn, mlp = sublayers
        a = attn(self.norms[0](x) * self.scale)
        x, h = self.norms[1].add_norm(x, a)  # x = x + a;  h = LN_1(x), fused
        return x + mlp(h * self.scale)

    def init_sublayers(self, attn: nn.Module, mlp: nn.Module, init: InitRule) -> None:
        pass  # no depth scaling of the init (with gpt2: plain std 0.02 everywhere)


@PLACEMENTS.register("b2t")
class BottomToTop(FinalOutputIsNormed, Placement):
    """B2T connection (Takase et al. 2022, arXiv 2206.00330): post-norm plus a skip from the block input to the
    last LN::

        h  = LN_1(x + Attn(x))
        x' = LN_2(h + FFN(h) + x)

        x ──┬──> Attn ─(+)─> LN_1 ──┬──> FFN ─(+)──(+)─> LN_2 ──>
            ├────────────┘           └────────┘    │
            └──────────────────────────────────────┘

    No final norm.
    """

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self.norms = nn.ModuleList([ctx.make_norm(), ctx.make_norm()])

    def forward(self, x: torch.Tensor, sublayers: Sequence[Sublayer]) -> torch.Tensor:
        attn, mlp = sublayers
        h = self.norms[0].add_norm(x, attn(x)).normed  # LN_1(x + Attn(x))
        return self.norms[1].add_norm(h, mlp(h) + x).normed  # LN_2(h + FFN(h) + x)


class ResiDualReadout(nn.Module):
    """ResiDual's output: ``x_N + LN(d_N)``."""

    def __init__(self, norm: Norm) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, stream: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, d = stream  # (B, T, C) each
        return x + self.norm(d)


@PLACEMENTS.register("resi_dual")
class ResiDual(Placement):
    """ResiDual (Xie et al. 2023, arXiv 2304.14802): a post-norm stream x and an un-normed dual stream d::

        o  = F(x)
        x' = LN(x + o)        (post-norm stream)
        d' = d + o            (dual stream, d_0 = 0)
        output = x_N + LN(d_N)

        x ──┬──> F ──(+)──> LN ──> x'
            └───────┘│
        d ───────────(+)─────────> d'

    The dual stream starts at zero, so it holds only the sum of sublayer
    outputs; the embeddings reach the output through x.
    """

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self.norms = nn.ModuleList([ctx.make_norm(), ctx.make_norm()])

    @staticmethod
    def embed(x: torch.Tensor) -> Stream:
        return x, torch.zeros_like(x)

    @staticmethod
    def residual(stream: Stream) -> torch.Tensor:
        return stream[1]  # the un-normed dual stream: x is renormalized after every sublayer

    @classmethod
    def build_readout(cls, make_norm: Callable[[], Norm]) -> nn.Module:
        return ResiDualReadout(make_norm())

    def forward(self, stream: Stream, sublayers: Sequence[Sublayer]) -> Stream:
        x, d = stream
        for norm, f in zip(self.norms, sublayers):
            o = f(x)  # (B, T, C)
            x = norm.add_norm(x, o).normed  # LN(x + o)
            d = d + o
        return x, d


@PLACEMENTS.register("resi_dual_embed")
class ResiDualFromEmbedding(ResiDual):
    """ResiDual as its reference code starts it (microsoft/ResiDual, ``resi_dual.py``: ``res = x *
    res_input_norm_scale``, scale 1.0): the dual stream holds the embeddings too::

        d_0 = x_0 (the embeddings), then as ResiDual: d' = d + o;  output = x_N + LN(d_N)

        x_0 ──┬──> post-norm stream x ──────────────(+)──> head
              └──> d ──(+ o)── ... ──(+ o)──> LN ────┘
    """

    @staticmethod
    def embed(x: torch.Tensor) -> Stream:
        return x, x


@PLACEMENTS.register("noresidual")
class NoResidual(FinalOutputIsNormed, SublayerPlacement):
    """No skip connection at all::

        x = LN(F(x))

        x ──> F ──> LN ──>

    Shows the degradation problem (He et al. 2016, arXiv 1512.03385): expected to train badly at depth.
    """

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self.norms = nn.ModuleList([ctx.make_norm(), ctx.make_norm()])

    def step(self, x: torch.Tensor, f: Sublayer, i: int) -> torch.Tensor:
        return self.norms[i](f(x))

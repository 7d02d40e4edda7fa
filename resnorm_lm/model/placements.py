"""Residual / normalization placements: where the norm sits around each sublayer.

A placement is the residual wiring of one transformer block (two sublayers:
attention, then MLP). It owns its norms and learnable scalars, says how the
residual stream starts (``embed``) and how it is read out before the LM head
(``build_readout``), and may define its own weight init (``init_sublayers``).
``Block`` and ``GPT`` never change when a placement is added: write one class
here and register it. Formulas follow ../shared/REFERENCES.md; ``F`` is a
sublayer, ``LN`` the configured norm, ``N`` the number of blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from resnorm_lm.model.init import InitRule
from resnorm_lm.model.norms import Norm
from resnorm_lm.registry import Registry

PLACEMENTS: Registry[type[Placement]] = Registry("placement")

Sublayer = Callable[[torch.Tensor], torch.Tensor]  # (B, T, C) -> (B, T, C)
# The residual stream between blocks: one tensor, or (post-norm stream, dual stream) for ResiDual.
Stream = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class BlockContext:
    """What a placement needs to know about the block it wires."""

    layer: int  # 0-based block index
    n_layer: int  # N, the number of blocks
    make_norm: Callable[..., Norm]  # a fresh norm of the configured kind and backend; role= what it feeds


class Placement(nn.Module):
    """Base class. Subclasses implement ``forward(stream, sublayers) -> stream``."""

    names_norm_roles = False  # True: each norm is built with the role it feeds (see ``Norm.for_role``)

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__()
        self.layer = ctx.layer
        self.n_layer = ctx.n_layer

    @staticmethod
    def embed(x: torch.Tensor) -> Stream:
        """The residual stream entering block 0, from the embeddings x (B, T, C)."""
        return x

    @staticmethod
    def residual(stream: Stream) -> torch.Tensor:
        """The tensor (B, T, C) whose growth with depth is measured (the residual stream's RMS): the stream."""
        return stream

    @classmethod
    def build_embedding_norm(cls, make_norm: Callable[[], Norm]) -> nn.Module:
        """Applied to the embeddings (B, T, C) before ``embed``: nothing, unless the placement's paper norms them."""
        return nn.Identity()

    @classmethod
    def build_readout(cls, make_norm: Callable[[], Norm]) -> nn.Module:
        """Maps the stream leaving the last block to the LM head's input (B, T, C)."""
        return make_norm(role="final")  # a final norm, as in GPT-2; post-norm placements override

    def init_sublayers(self, attn: nn.Module, mlp: nn.Module, init: InitRule) -> None:
        """After ``init`` set every weight: the init's own depth rule (GPT-2's: the residual output projections
        at std 0.02 / sqrt(2N)); a placement with a rule of its own from its paper overrides this."""
        init.scale_branch_outputs(attn, mlp, self.n_layer)


class FinalOutputIsNormed:
    """Mixin for placements whose stream is already normalized: no final norm."""

    @classmethod
    def build_readout(cls, make_norm: Callable[[], Norm]) -> nn.Module:
        return nn.Identity()


class SublayerPlacement(Placement):
    """A placement whose formula is the same for each sublayer: ``x = step(x, F, i)``."""

    def forward(self, stream: torch.Tensor, sublayers: Sequence[Sublayer]) -> torch.Tensor:
        for i, f in enumerate(sublayers):
            stream = self.step(stream, f, i)
        return stream

    def step(self, x: torch.Tensor, f: Sublayer, i: int) -> torch.Tensor:
        raise NotImplementedError


@PLACEMENTS.register("postnorm")
class PostNorm(FinalOutputIsNormed, SublayerPlacement):
    """Post-LN, the original "Add & Norm" (Vaswani et al. 2017)::

        x = LN(x + F(x))

        x ──┬──> F ──(+)──> LN ──>
            └────────┘

    No final norm: the stream is already normalized. Needs LR warmup (Xiong et al. 2020).
    """

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self.norms = nn.ModuleList([ctx.make_norm(), ctx.make_norm()])

    def step(self, x: torch.Tensor, f: Sublayer, i: int) -> torch.Tensor:
        y, _ = self.norms[i].add_norm(x, f(x))
        return y


@PLACEMENTS.register("prenorm")
class PreNorm(Placement):
    """Pre-LN, as in GPT-2 (Xiong et al. 2020)::

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
        h, x = self.norms[1].add_norm(x, a)  # LN_1(x + a) and x + a: one fused pass on the triton backend
        return x + mlp(h)


@PLACEMENTS.register("sandwich")
class Sandwich(Placement):
    """Sandwich / Peri-LN (CogView 2021; arXiv 2502.02732)::

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
        h, x = self.norms_in[1].add_norm(x, a)  # the add and the next input norm, fused
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
    """DeepNorm (DeepNet, arXiv 2203.00555), decoder-only constants::

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
        y, _ = self.norms[i].add_norm(self.alpha * x, f(x))
        return y

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
class ReZero(FinalOutputIsNormed, SublayerPlacement):
    """ReZero (arXiv 2003.04887): no norm at all, a zero-initialised gate per sublayer::

        x = x + a * F(x),   a = 0 at init

        x ──┬──> F ──> * a ──(+)──>
            └─────────────────┘

    At init every block is the identity. No final norm (no norm anywhere).
    """

    n_gates = 2  # one scalar a per sublayer

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self.gates = nn.Parameter(torch.zeros(self.n_gates))

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
    """Mix-LN (arXiv 2412.13795): post-norm in the first blocks, pre-norm after::

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
    """LayerNorm Scaling (arXiv 2502.05795): pre-norm with the norm output scaled by depth::

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
        h, x = self.norms[1].add_norm(x, a)  # the add and the next input norm, fused
        return x + mlp(h * self.scale)

    def init_sublayers(self, attn: nn.Module, mlp: nn.Module, init: InitRule) -> None:
        pass  # no depth scaling of the init (with gpt2: plain std 0.02 everywhere)


@PLACEMENTS.register("b2t")
class BottomToTop(FinalOutputIsNormed, Placement):
    """B2T connection (arXiv 2206.00330): post-norm plus a skip from the block input to the last LN::

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
        h, _ = self.norms[0].add_norm(x, attn(x))
        y, _ = self.norms[1].add_norm(h, mlp(h) + x)
        return y


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
    """ResiDual (arXiv 2304.14802): a post-norm stream x and an un-normed dual stream d::

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
            x, _ = norm.add_norm(x, o)
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

    Shows the degradation problem (He et al. 2016): expected to train badly at depth.
    """

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self.norms = nn.ModuleList([ctx.make_norm(), ctx.make_norm()])

    def step(self, x: torch.Tensor, f: Sublayer, i: int) -> torch.Tensor:
        return self.norms[i](f(x))

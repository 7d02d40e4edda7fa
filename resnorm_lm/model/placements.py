"""The residual / normalization placements, by name: each a transformer block whose ``forward`` is its formula.

A placement is a ``Block`` (``block.py``): attention ``self.attn`` and MLP ``self.mlp``, the norms its formula
names, its learnable scalars, its residual stream's two ends (``residual_stream``: a final norm or not, an
embedding norm, a second stream) and its own init rule where its paper has one (``init_depth``). Adding one is
one class here and one decorator line; ``GPT`` never changes. Each class gives its formula, a diagram and the
paper it follows (authors, year, arXiv id); ``F`` is a sublayer, ``LN`` the configured norm, ``N`` the number of
blocks. ``norm.add_norm(x, d)`` is ``(x + d, norm(x + d))`` and ``norm.of_sum(x, d)`` is ``norm(x + d)``: the
add and the norm in one kernel on the fused backend.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from resnorm_lm.model.block import Block, MakeNorm, NormedEmbeddings, NormedStream, ResidualStream, Stream
from resnorm_lm.model.init import InitRule
from resnorm_lm.registry import Registry

PLACEMENTS: Registry[type[Block]] = Registry("placement")


@PLACEMENTS.register("postnorm")
class PostNorm(NormedStream, Block):
    """Post-LN, the original "Add & Norm" (Vaswani et al. 2017, arXiv 1706.03762)::

        x = LN(x + F(x))

        x ──┬──> F ──(+)──> LN ──>
            └────────┘

    No final norm: the stream is already normalized. Needs LR warmup (Xiong et al. 2020, arXiv 2002.04745).
    """

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.attn_norm, self.mlp_norm = make_norm(), make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn_norm.of_sum(x, self.attn(x))  # x = LN(x + Attn(x))
        return self.mlp_norm.of_sum(x, self.mlp(x))  # x = LN(x + MLP(x))


@PLACEMENTS.register("prenorm")
class PreNorm(Block):
    """Pre-LN, as in GPT-2 (Radford et al. 2019; analysed by Xiong et al. 2020, arXiv 2002.04745)::

        x = x + F(LN(x))

        x ──┬──> LN ──> F ──(+)──>
            └───────────────┘

    A final LN before the LM head.
    """

    names_norm_roles = True

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.attn_norm, self.mlp_norm = make_norm(role="attention"), make_norm(role="mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, h = self.mlp_norm.add_norm(x, self.attn(self.attn_norm(x)))  # x = x + Attn(LN(x));  h = LN(x)
        return x + self.mlp(h)  # x = x + MLP(h)


@PLACEMENTS.register("sandwich")
class Sandwich(Block):
    """Sandwich (CogView: Ding et al. 2021, arXiv 2105.13290), or Peri-LN (Kim et al. 2025, arXiv 2502.02732)::

        x = x + LN_out(F(LN_in(x)))

        x ──┬──> LN_in ──> F ──> LN_out ──(+)──>
            └──────────────────────────────┘

    A final LN before the LM head.
    """

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.attn_in_norm, self.mlp_in_norm = make_norm(), make_norm()
        self.attn_out_norm, self.mlp_out_norm = make_norm(), make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attn_out_norm(self.attn(self.attn_in_norm(x)))  # LN_out(Attn(LN_in(x)))
        x, h = self.mlp_in_norm.add_norm(x, a)  # x = x + a;  h = LN_in(x)
        return x + self.mlp_out_norm(self.mlp(h))  # x = x + LN_out(MLP(h))


@PLACEMENTS.register("peri_ln")
class PeriLN(NormedEmbeddings, Sandwich):
    """Peri-LN with its optional embedding norm (Kim et al. 2025, arXiv 2502.02732, as an option: ``y_0 =
    Norm(x_embed)``), so the first block's stream starts at unit RMS like the normed sublayer outputs added to it
    (the embeddings alone are at std 0.02 under GPT-2's init)::

        x_0 = LN_emb(embeddings);   x = x + LN_out(F(LN_in(x)))

        emb ──> LN_emb ──┬──> LN_in ──> F ──> LN_out ──(+)──> ...
                         └──────────────────────────────┘
    """


@PLACEMENTS.register("olmo2")
class ReorderedNorm(Block):
    """OLMo 2's reordered norm (OLMo et al. 2025, arXiv 2501.00656, eqs. 1-2; allenai/OLMo-core
    ``ReorderedNormTransformerBlock``): the norm on each sublayer's output, none on its input::

        x = x + LN(F(x))

        x ──┬──> F ──> LN ──(+)──>
            └──────────────────┘

    The sublayers read the raw stream. A final LN before the LM head (OLMo-core's ``LMHead`` has one). OLMo 2
    pairs it with RMSNorm and QK-norm over all heads (``qk_norm: full``), which the paper says work together
    (section 3.3.2): recipe olmo2-12l.
    """

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.attn_norm, self.mlp_norm = make_norm(), make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn_norm(self.attn(x))  # x = x + LN(Attn(x))
        return x + self.mlp_norm(self.mlp(x))  # x = x + LN(MLP(x))


@PLACEMENTS.register("olmo2_embed_norm")
class ReorderedNormOnNormedEmbeddings(NormedEmbeddings, ReorderedNorm):
    """OLMo 2's reordered norm (arXiv 2501.00656) on embeddings normed as Peri-LN's option does it (arXiv
    2502.02732): not OLMo 2's own setup, a probe of one cause of its gap at this scale. Its sublayers read the raw
    stream, which starts at the embeddings' RMS (0.028 under GPT-2's init: token and position, std 0.02 each)
    while each normed sublayer output added to it is as large as its norm's gain; normed, the embeddings start at
    unit RMS::

        x_0 = LN_emb(embeddings);   x = x + LN(F(x))

        emb ──> LN_emb ──┬──> F ──> LN ──(+)──> ...
                         └──────────────────┘
    """


@PLACEMENTS.register("deepnorm")
class DeepNorm(NormedStream, Block):
    """DeepNorm (DeepNet: Wang et al. 2022, arXiv 2203.00555), decoder-only constants::

        x = LN(alpha * x + F(x)),   alpha = (2N)^(1/4)

        x ──┬──> F ─────────(+)──> LN ──>
            └──> * alpha ────┘

    Init: the MLP, attention value and attention output weights and biases are multiplied by beta = (8N)^(-1/4)
    (a divisor of whatever the init set, as torchscale divides its Xavier init; not a gain on the output), in
    place of the init's depth rule. Alpha scales the residual, not F. No final norm.
    """

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.attn_norm, self.mlp_norm = make_norm(), make_norm()
        self.alpha = self.residual_scale(cfg.n_layer)
        self.beta = self.init_scale(cfg.n_layer)

    @staticmethod
    def residual_scale(n_layer: int) -> float:
        return (2 * n_layer) ** 0.25

    @staticmethod
    def init_scale(n_layer: int) -> float:
        return (8 * n_layer) ** -0.25

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn_norm.of_sum(self.alpha * x, self.attn(x))  # x = LN(alpha x + Attn(x))
        return self.mlp_norm.of_sum(self.alpha * x, self.mlp(x))  # x = LN(alpha x + MLP(x))

    def init_depth(self, init: InitRule) -> None:
        self.attn.scale_values_and_output(self.beta)
        self.mlp.scale_weights(self.beta)


@PLACEMENTS.register("rezero")
class ReZero(Block):
    """ReZero (Bachlechner et al. 2020, arXiv 2003.04887): no norm at all, a zero-initialised gate per sublayer::

        x = x + a * F(x),   a = 0 at init

        x ──┬──> F ──> * a ──(+)──>
            └─────────────────┘

    At init every block is the identity. No final norm either: the stream is not normalized, there is no norm
    anywhere, and the config's norm settings are refused (``has_norms``).
    """

    has_norms = False
    n_gates = 2  # a[0] before attention, a[1] before the MLP

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.alpha = nn.Parameter(torch.zeros(self.n_gates))

    @classmethod
    def residual_stream(cls, cfg, make_norm: MakeNorm) -> ResidualStream:
        return ResidualStream(cfg, cls.blocks(cfg, make_norm))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.alpha[0] * self.attn(x)  # x = x + a Attn(x)
        return x + self.alpha[-1] * self.mlp(x)  # x = x + a' MLP(x)


@PLACEMENTS.register("rezero_shared")
class ReZeroShared(ReZero):
    """ReZero as its reference code has it (majumderb/rezero, ``rztx.py``: one ``resweight`` per layer): one gate
    shared by a block's attention and MLP::

        x = x + a * Attn(x);   x = x + a * MLP(x),   a = 0 at init

        x ──┬──> F ──> * a ──(+)──>     (the same a for both sublayers)
            └─────────────────┘
    """

    n_gates = 1  # a[0] == a[-1]: one scalar a per block


@PLACEMENTS.register("mixln")
class MixLN(Block):
    """Mix-LN (Li et al. 2024, arXiv 2412.13795): post-norm in the first blocks, pre-norm after::

        block l < floor(r * N):  x = LN(x + F(x))      (PostNorm)
        block l >= floor(r * N): x = x + F(LN(x))      (PreNorm)

        embed ──> [Post] x floor(rN) ──> [Pre] x (N - floor(rN)) ──> LN ──> head

    r = 0.25 as in the paper; the switch is per block (both sublayers of a block share a placement). A final
    LN, since the last blocks are pre-norm.
    """

    post_fraction = 0.25

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.post = layer < math.floor(self.post_fraction * cfg.n_layer)
        self.attn_norm, self.mlp_norm = make_norm(), make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return PostNorm.forward(self, x) if self.post else PreNorm.forward(self, x)


@PLACEMENTS.register("lns")
class LayerNormScaling(Block):
    """LayerNorm Scaling (Sun et al. 2025, arXiv 2502.05795): pre-norm with the norm output scaled by depth::

        x = x + F(LN(x) / sqrt(l)),   l = 1-based block index

        x ──┬──> LN ──> / sqrt(l) ──> F ──(+)──>
            └──────────────────────────────┘

    A final LN. The GPT-2 depth-scaled init is dropped, as the paper says.
    """

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.attn_norm, self.mlp_norm = make_norm(), make_norm()
        self.scale = 1.0 / math.sqrt(layer + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, h = self.mlp_norm.add_norm(x, self.attn(self.attn_norm(x) * self.scale))  # x = x + Attn(LN(x)/sqrt(l))
        return x + self.mlp(h * self.scale)  # x = x + MLP(LN(x)/sqrt(l))

    def init_depth(self, init: InitRule) -> None:
        pass  # no depth scaling of the init (with gpt2: plain std 0.02 everywhere)


@PLACEMENTS.register("b2t")
class BottomToTop(NormedStream, Block):
    """B2T connection (Takase et al. 2022, arXiv 2206.00330): post-norm plus a skip from the block input to the
    last LN::

        h  = LN_1(x + Attn(x))
        x' = LN_2(h + FFN(h) + x)

        x ──┬──> Attn ─(+)─> LN_1 ──┬──> FFN ─(+)──(+)─> LN_2 ──>
            ├────────────┘           └────────┘    │
            └──────────────────────────────────────┘

    No final norm.
    """

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.attn_norm, self.mlp_norm = make_norm(), make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attn_norm.of_sum(x, self.attn(x))  # h = LN_1(x + Attn(x))
        return self.mlp_norm.of_sum(h, self.mlp(h) + x)  # x' = LN_2(h + FFN(h) + x)


class DualStream(ResidualStream):
    """ResiDual's stream: (x, d), the post-norm stream and the dual stream; it leaves as ``x_N + LN(d_N)``."""

    dual_from_embeddings = False  # d_0 = 0 (the paper), or d_0 = the embeddings (its reference code)

    def enter(self, x: torch.Tensor) -> Stream:
        x = super().enter(x)
        return x, (x if self.dual_from_embeddings else torch.zeros_like(x))

    def exit(self, stream: Stream) -> torch.Tensor:
        x, d = stream  # (B, T, C) each
        return x + self.final_norm(d)

    @staticmethod
    def residual(stream: Stream) -> torch.Tensor:
        return stream[1]  # the un-normed dual stream: x is renormalized after every sublayer

    @staticmethod
    def block_input(stream: Stream) -> torch.Tensor:
        return stream[0]  # the post-norm stream x: what the sublayers read


class DualStreamFromEmbeddings(DualStream):
    dual_from_embeddings = True


@PLACEMENTS.register("resi_dual")
class ResiDual(Block):
    """ResiDual (Xie et al. 2023, arXiv 2304.14802): a post-norm stream x and an un-normed dual stream d::

        o  = F(x)
        x' = LN(x + o)        (post-norm stream)
        d' = d + o            (dual stream, d_0 = 0)
        output = x_N + LN(d_N)

        x ──┬──> F ──(+)──> LN ──> x'
            └───────┘│
        d ───────────(+)─────────> d'

    The dual stream starts at zero, so it holds only the sum of sublayer outputs; the embeddings reach the output
    through x.
    """

    stream = DualStream

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.attn_norm, self.mlp_norm = make_norm(), make_norm()

    @classmethod
    def residual_stream(cls, cfg, make_norm: MakeNorm) -> ResidualStream:
        return cls.stream(cfg, cls.blocks(cfg, make_norm), final_norm=make_norm())

    def forward(self, stream: Stream) -> Stream:
        x, d = stream
        o = self.attn(x)
        x, d = self.attn_norm.of_sum(x, o), d + o  # x = LN(x + Attn(x));  d = d + Attn(x)
        o = self.mlp(x)
        return self.mlp_norm.of_sum(x, o), d + o  # x = LN(x + MLP(x));  d = d + MLP(x)


@PLACEMENTS.register("resi_dual_embed")
class ResiDualFromEmbedding(ResiDual):
    """ResiDual as its reference code starts it (microsoft/ResiDual, ``resi_dual.py``: ``res = x *
    res_input_norm_scale``, scale 1.0): the dual stream holds the embeddings too::

        d_0 = x_0 (the embeddings), then as ResiDual: d' = d + o;  output = x_N + LN(d_N)

        x_0 ──┬──> post-norm stream x ──────────────(+)──> head
              └──> d ──(+ o)── ... ──(+ o)──> LN ────┘
    """

    stream = DualStreamFromEmbeddings


@PLACEMENTS.register("noresidual")
class NoResidual(NormedStream, Block):
    """No skip connection at all::

        x = LN(F(x))

        x ──> F ──> LN ──>

    Shows the degradation problem (He et al. 2016, arXiv 1512.03385): expected to train badly at depth.
    """

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.attn_norm, self.mlp_norm = make_norm(), make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_norm(self.mlp(self.attn_norm(self.attn(x))))  # x = LN(MLP(LN(Attn(x))))


# The designs whose stream is more than one tensor, each in a module of its own that registers its placements here
from resnorm_lm.model import depth_attention, hyper_connections  # noqa: E402, F401

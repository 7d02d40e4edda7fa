"""Residuals that weigh the depth: a sublayer or block reads a learned mix of all the outputs before it.

Attention Residuals (Kimi Team 2026, arXiv 2603.15031), full and by blocks, and DenseFormer (Pagliardini et al.
2024, arXiv 2402.02622). Their stream is not one tensor but the earlier outputs a later layer weighs: a tuple of
(B, T, C) tensors, with a ``ResidualStream`` subclass per design saying how it starts (``enter``), how it is read
out (``exit``), and which (B, T, C) tensor stands for it in the per-block measurements (``residual`` for the
stream's RMS, ``block_input`` for layer contribution's angular distance). Tuples, not lists: a block that returns
its input (layer contribution's skip) changes nothing. The tuples grow block by block; a compiled model traces
each block once at its own length (one graph for the model, no recompile per step).

Imported at the end of placements.py, whose ``PLACEMENTS`` these register in.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from resnorm_lm.model.block import Block, MakeNorm, ResidualStream
from resnorm_lm.model.norms import RMSNorm
from resnorm_lm.model.placements import PLACEMENTS, PreNorm

Values = tuple[torch.Tensor, ...]  # (B, T, C) each: AttnRes's v_0 .. v_l, or its block sums b_0 .. b_n
Dense = tuple[Values, torch.Tensor]  # DenseFormer's (X_0 .. X_k) and Y, the average the next block reads


class DepthAttention(nn.Module):
    """Softmax attention over depth with one learned query (AttnRes, arXiv 2603.15031, Eqs. 2-4)::

        h = sum_i softmax_i(w . RMSNorm(v_i)) v_i,    w = 0 at init: h = mean_i v_i

    No 1/sqrt(d) temperature; the values are the un-normalized v_i. The RMSNorm's gain g is redundant with w
    (w . (g * v / rms(v)) = (w * g) . v / rms(v)) but the paper's pseudo-code has it, so it is here, as this
    package's RMSNorm (weight ones). It is computed in that folded form: the same number, without a normalized copy
    of every value kept for the backward (O(L^2) (B, T, C) tensors over L sublayers). At w = 0 its gain gets no
    gradient (the logit is w . ...) until w moves.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.zeros(dim))  # w (C,): zero, "all pseudo-queries must be initialized to zero"
        self.key_norm = RMSNorm(dim, eps=eps)

    def weights(self, values: Values) -> torch.Tensor:
        """softmax over depth of w . RMSNorm(v_i): (N, B, T), fp32."""
        q = self.query * self.key_norm.weight  # (C,): w * g
        logits = torch.stack([(v * q).sum(-1) * self.inverse_rms(v) for v in values])  # (N, B, T)
        return logits.softmax(dim=0)

    def inverse_rms(self, v: torch.Tensor) -> torch.Tensor:
        """1 / sqrt(mean(v^2) + eps): (B, T) in fp32 (fp64 for an fp64 model) from v (B, T, C) in its own dtype (no
        fp32 copy of v kept)."""
        dtype = torch.promote_types(v.dtype, torch.float32)
        mean_square = torch.linalg.vector_norm(v, dim=-1, dtype=dtype).square() / v.shape[-1]
        return torch.rsqrt(mean_square + self.key_norm.eps)

    def forward(self, values: Values) -> torch.Tensor:
        a = self.weights(values)  # (N, B, T)
        return sum(a_i.unsqueeze(-1) * v for a_i, v in zip(a, values))  # (B, T, C)


class AttnResStream(ResidualStream):
    """AttnRes's stream: the values (v_0 = the embeddings, then each sublayer's output; or Block AttnRes's block
    sums b_0 .. b_n). It leaves through one more depth attention with its own query, then the final norm::

        exit = LN_f(sum_i softmax_i(w_out . RMSNorm_out(v_i)) v_i)

    ``residual``: the values' sum, the embeddings plus every sublayer output so far, what a plain residual stream
    would hold with these outputs (the growth that the softmax keeps out of every sublayer's input).
    ``block_input``: their mean, what the next sublayer reads while its query is zero (at init); the sum's
    direction, so a block's angular distance is the angle a plain stream with these outputs would turn by. (What a
    sublayer reads once its query has moved depends on that query, which the stream does not hold.)
    """

    def __init__(self, cfg, blocks: list[Block], final_norm: nn.Module) -> None:
        super().__init__(cfg, blocks, final_norm=final_norm)
        self.readout = DepthAttention(cfg.n_embd, cfg.norm_eps)

    def enter(self, x: torch.Tensor) -> Values:
        return (super().enter(x),)  # v_0 (B, T, C)

    def exit(self, values: Values) -> torch.Tensor:
        return self.final_norm(self.readout(values))

    @staticmethod
    def residual(values: Values) -> torch.Tensor:
        return sum(values)

    @staticmethod
    def block_input(values: Values) -> torch.Tensor:
        return sum(values) / len(values)


@PLACEMENTS.register("attnres")
class AttnRes(Block):
    """Full Attention Residuals (Kimi Team 2026, arXiv 2603.15031, section 3.1): each sublayer (attention and MLP
    each a layer) reads a softmax-weighted mix of the embeddings and every earlier sublayer's raw output, in place
    of their running sum, through its own pre-norm::

        v_0 = x (the embeddings),   v_l = F_l(LN(h_l))
        h_l = sum_{i<l} softmax_i(w_l . RMSNorm_l(v_i)) v_i,   w_l = 0 at init (a uniform average)
        output = LN_f(AttnRes_out(v_0 .. v_2N))

        (v_0 .. v_{l-1}) ──> softmax_i(w_l . RMSNorm_l(v_i)) ──> h_l ──> LN ──> F_l ──> v_l
               └──────────────────────── append v_l ─────────────────────────────────┘

    The first sublayer reads h_1 = v_0 (a softmax over one value is 1), so it has no query, whose gradient would be
    zero for good. At init every sublayer reads the average, not a plain stream's sum. Block AttnRes is this with
    depth-blocks of several sublayers (``max_blocks``); here each sublayer is its own.
    """

    names_norm_roles = True
    max_blocks: int | None = None  # the most depth-blocks (None: one per sublayer, Full AttnRes)

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.attn_norm, self.mlp_norm = make_norm(role="attention"), make_norm(role="mlp")
        self.attn_res = DepthAttention(cfg.n_embd, cfg.norm_eps) if layer > 0 else None
        self.mlp_res = DepthAttention(cfg.n_embd, cfg.norm_eps)
        s = self.sublayers_per_block(cfg.n_layer)
        # the depth-block n (1-based; b_0 is the embeddings) of this block's attention (sublayer 2l) and MLP (2l + 1)
        self.attn_depth_block, self.mlp_depth_block = 2 * layer // s + 1, (2 * layer + 1) // s + 1

    @classmethod
    def sublayers_per_block(cls, n_layer: int) -> int:
        """S, the sublayers of one depth-block: the 2N sublayers split into at most ``max_blocks`` blocks."""
        n_sublayers = 2 * n_layer
        return 1 if cls.max_blocks is None else math.ceil(n_sublayers / min(cls.max_blocks, n_sublayers))

    @classmethod
    def residual_stream(cls, cfg, make_norm: MakeNorm) -> ResidualStream:
        return AttnResStream(cfg, cls.blocks(cfg, make_norm), final_norm=make_norm(role="final"))

    def forward(self, values: Values) -> Values:
        values = self.sublayer(values, self.attn_res, self.attn_norm, self.attn, self.attn_depth_block)
        return self.sublayer(values, self.mlp_res, self.mlp_norm, self.mlp, self.mlp_depth_block)

    @staticmethod
    def sublayer(
        values: Values, depth_attention: DepthAttention | None, norm: nn.Module, f: nn.Module, n: int
    ) -> Values:
        """h = AttnRes(values);  v = F(LN(h));  v begins depth-block n, or adds to its partial sum b_n."""
        h = values[0] if depth_attention is None else depth_attention(values)  # (B, T, C)
        v = f(norm(h))  # (B, T, C)
        if len(values) <= n:  # values = (b_0 .. b_{n-1}): block n not begun (fewer after a skipped block)
            return values + (v,)
        return values[:-1] + (values[-1] + v,)  # b_n = b_n + v


@PLACEMENTS.register("attnres_block")
class BlockAttnRes(AttnRes):
    """Block Attention Residuals (Kimi Team 2026, arXiv 2603.15031, section 3.2): the 2N sublayers in M
    depth-blocks of S (the paper's N blocks); a sublayer attends over the embeddings, the finished depth-blocks'
    sums and its own depth-block's partial sum::

        b_0 = x (the embeddings),   b_n = sum_{j in depth-block n} F_j(LN(h_j))   (b_n^i: its first i outputs)
        h for the i-th sublayer of depth-block n = AttnRes(b_0 .. b_{n-1}, and b_n^{i-1} if i > 1)
        output = LN_f(AttnRes_out(b_0 .. b_M))

        (b_0 .. b_{n-1}, b_n^{i-1}) ──> AttnRes ──> LN ──> F ──(+)──> b_n^i
                              └──────────────────────────────┘

    S = ceil(2N / min(8, 2N)): at most 8 depth-blocks, as the paper finds about 8 recover most of Full AttnRes's
    gain. 12 blocks (24 sublayers) make 8 depth-blocks of 3, 16 blocks 8 of 4, 24 blocks 8 of 6; a model of 4
    blocks or fewer is Full AttnRes (S = 1). With S odd a depth-block ends inside a transformer block (Fig. 2's
    pseudo-code closes blocks only before an attention; the text has no such limit). As the text says, b_0 is the
    embeddings alone and b_n holds only sublayer outputs (Fig. 2's pseudo-code would count the embeddings in b_1
    too). The readout attends over all M depth-block sums, the last one included.
    """

    max_blocks = 8


class DenseStream(ResidualStream):
    """DenseFormer's stream: (X, Y), X = (X_0 .. X_k) the embeddings and each block's raw output, Y the last
    depth-weighted average, which the next block reads. It enters as ((x,), x) and leaves as LN_f(Y).
    ``residual`` and ``block_input`` are Y: the stream each pre-norm block adds to."""

    def enter(self, x: torch.Tensor) -> Dense:
        x = super().enter(x)  # X_0 (B, T, C), after the input dropout as in the reference
        return (x,), x

    def exit(self, stream: Dense) -> torch.Tensor:
        return self.final_norm(stream[1])

    @staticmethod
    def residual(stream: Dense) -> torch.Tensor:
        return stream[1]

    @staticmethod
    def block_input(stream: Dense) -> torch.Tensor:
        return stream[1]


@PLACEMENTS.register("denseformer")
class DenseFormer(PreNorm):
    """DenseFormer (Pagliardini et al. 2024, arXiv 2402.02622; reference code epfml/DenseFormer): pre-norm blocks,
    each followed by a depth-weighted average (DWA) of the embeddings and every block's raw output so far::

        X_0 = x,   X_{i+1} = PreNormBlock_i(Y_{i-1}),   Y_{-1} = X_0
        Y_i = sum_{j=0}^{i+1} a_{i,j} X_j,   a_{i,j} = 1 if j = i+1 else 0 at init (pre-norm exactly)
        output = LN_f(Y_{N-1})

        Y ──> x + Attn(LN x); x + MLP(LN x) ──> X_{i+1} ──> sum_j a_{i,j} X_j ──> Y'
                                   X_0 .. X_i ─────────────────┘

    The 1x1 DenseFormer: a DWA after every block (period 1) over every earlier output (dilation 1). The a are
    plain parameters, which the init rules (Linear and Embedding weights) leave at the identity; the reference
    package warns that a global re-init of Linears would not. 1-D, so never weight-decayed here (``parameter_groups``).
    """

    def __init__(self, cfg, layer: int, make_norm: MakeNorm) -> None:
        super().__init__(cfg, layer, make_norm)
        self.layer = layer
        self.dwa = nn.Parameter(torch.zeros(layer + 2))  # a_{i,0..i+1}: over X_0 .. X_{i+1}
        with torch.no_grad():
            self.dwa[-1] = 1.0  # this block's own output

    @classmethod
    def residual_stream(cls, cfg, make_norm: MakeNorm) -> ResidualStream:
        return DenseStream(cfg, cls.blocks(cfg, make_norm), final_norm=make_norm(role="final"))

    def forward(self, stream: Dense) -> Dense:
        xs, y = stream  # (X_0 .. X_i), Y_{i-1}
        # a block skipped before this one (layer contribution) was the identity: its output X was its input Y
        xs = xs + (y,) * (self.layer + 1 - len(xs))
        xs = xs + (super().forward(y),)  # X_{i+1} = PreNormBlock(Y_{i-1})
        return xs, sum(a * x for a, x in zip(self.dwa, xs))  # Y_i = sum_j a_{i,j} X_j (B, T, C)

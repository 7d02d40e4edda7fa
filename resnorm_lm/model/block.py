"""What every placement is built from: a transformer block, and the residual stream the blocks sit on.

A placement is a ``Block`` subclass (``placements.py``): the block's attention and MLP, the norms its formula
names (``attn_norm``, ``mlp_norm``, ...), and a ``forward`` that reads as that formula. The model never changes
when a placement is added. What happens before the first block and after the last is the placement's too:
``Block.residual_stream`` builds the model's ``ResidualStream``, the blocks between the stream's two ends,
``enter`` (the embeddings become the stream) and ``exit`` (the stream becomes the LM head's input).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from resnorm_lm.model.init import InitRule
from resnorm_lm.model.layers import MLP, CausalSelfAttention
from resnorm_lm.model.norms import NORM_BACKENDS, Norm

if TYPE_CHECKING:
    from resnorm_lm.model.gpt import GPTConfig

# The residual stream between blocks: one tensor (B, T, C), or (post-norm stream, dual stream) for ResiDual.
Stream = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
MakeNorm = Callable[..., Norm]  # make_norm(role=None): a fresh norm of the configured kind, width and backend


class ResidualStream(nn.Module):
    """The blocks on the residual stream, between its two ends::

        enter:  embeddings ──> embed_scale ──> embed_norm ──> dropout ──> stream
        blocks: stream ──> block 0 ──> ... ──> block N-1 ──> stream
        exit:   stream ──> final_norm ──> the LM head's input (B, T, C)

    ``embed_scale`` is the norm's (DyT's LLaMA setup scales the embeddings by a learned scalar), ``embed_norm`` a
    placement's that asks for one (Peri-LN's), ``final_norm`` that of the placements whose stream does not leave
    the last block normalized; what is left out is the identity. A placement whose stream is not one tensor
    (ResiDual's) subclasses this and says how it enters, exits and which tensor is its residual.
    """

    def __init__(
        self,
        cfg: GPTConfig,
        blocks: list[Block],
        final_norm: nn.Module | None = None,
        embed_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        # registered in this order: the parameters' order (the optimizer's state, the summed gradient norm) with it
        self.embed_scale = NORM_BACKENDS.get(cfg.norm_backend).norm_class(cfg.norm).input_scale(cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(blocks)
        self.embed_norm = embed_norm or nn.Identity()
        self.final_norm = final_norm or nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stream = self.enter(x)  # the embeddings x (B, T, C) become the stream
        for block in self.blocks:
            stream = block(stream)
        return self.exit(stream)  # (B, T, C)

    def enter(self, x: torch.Tensor) -> Stream:
        return self.drop(self.embed_norm(self.embed_scale(x)))

    def exit(self, stream: Stream) -> torch.Tensor:
        return self.final_norm(stream)

    @staticmethod
    def residual(stream: Stream) -> torch.Tensor:
        """The tensor (B, T, C) whose growth with depth is measured (the residual stream's RMS): the stream."""
        return stream

    def diagnostics(self) -> dict[str, torch.Tensor]:
        """What the stream measured of itself in its last forward pass, by metrics.csv column (0-dim tensors),
        logged beside the per-block diagnostics: nothing, for a plain stream (hyper-connections: the gain of
        their stream mixes composed across the layers)."""
        return {}

    @staticmethod
    def block_input(stream: Stream) -> torch.Tensor:
        """The tensor (B, T, C) the next block's sublayers read, whose change across a block is the block's
        angular distance (layer contribution): the stream."""
        return stream


class Block(nn.Module):
    """One transformer block, attention then MLP, wired by a placement: subclasses write ``forward``.

    ``layer`` is the block's 0-based index among ``cfg.n_layer``; ``make_norm`` builds each norm the formula
    names (``role=`` what it feeds, for norms whose init depends on it)."""

    names_norm_roles = False  # True: each norm is built with the role it feeds (see ``Norm.for_role``)
    has_norms = True  # False: the config's norm settings mean nothing here, and GPTConfig refuses them

    def __init__(self, cfg: GPTConfig, layer: int, make_norm: MakeNorm) -> None:
        super().__init__()
        self.n_layer = cfg.n_layer
        self.attn = CausalSelfAttention(cfg)
        self.mlp = MLP(cfg)

    def forward(self, stream: Stream) -> Stream:
        raise NotImplementedError

    @classmethod
    def residual_stream(cls, cfg: GPTConfig, make_norm: MakeNorm) -> ResidualStream:
        """The model's blocks on their stream, with a final norm before the LM head (as in GPT-2)."""
        return ResidualStream(cfg, cls.blocks(cfg, make_norm), final_norm=make_norm(role="final"))

    @classmethod
    def blocks(cls, cfg: GPTConfig, make_norm: MakeNorm) -> list[Block]:
        return [cls(cfg, layer, make_norm) for layer in range(cfg.n_layer)]

    def init_depth(self, init: InitRule) -> None:
        """After ``init`` set every weight, its rule for depth (GPT-2's: the attention's and the MLP's output
        projections at std 0.02 / sqrt(2N)); a placement with a rule of its own from its paper overrides this."""
        init.scale_branch_outputs(self.attn, self.mlp, self.n_layer)


class NormedStream:
    """Mixin for placements whose every block ends with a norm: the stream leaves the last block normalized,
    so there is no final norm."""

    @classmethod
    def residual_stream(cls, cfg: GPTConfig, make_norm: MakeNorm) -> ResidualStream:
        return ResidualStream(cfg, cls.blocks(cfg, make_norm))


class NormedEmbeddings:
    """Mixin for placements that norm the embeddings before the first block (Peri-LN's option, Kim et al. 2025,
    arXiv 2502.02732: ``y_0 = Norm(x_embed)``), so that the stream starts at the RMS of the normed sublayer
    outputs added to it rather than at the embeddings' std 0.02 under GPT-2's init. A final norm as in GPT-2."""

    @classmethod
    def residual_stream(cls, cfg: GPTConfig, make_norm: MakeNorm) -> ResidualStream:
        blocks = cls.blocks(cfg, make_norm)
        return ResidualStream(cfg, blocks, final_norm=make_norm(role="final"), embed_norm=make_norm())

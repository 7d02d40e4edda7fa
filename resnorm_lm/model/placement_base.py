"""What a placement is: the base class every residual / normalization placement subclasses, and what it is given.

A placement is the residual wiring of one transformer block (two sublayers: attention, then MLP). ``Placement``
says what one must offer: ``forward(stream, sublayers)``, how the residual stream starts (``embed``), how it is
read out before the LM head (``build_readout``), which tensor is the residual (``residual``), and its weight
init (``init_sublayers``). The placements themselves are in ``placements.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from resnorm_lm.model.init import InitRule
from resnorm_lm.model.norms import Norm

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
    has_norms = True  # False: the config's norm settings mean nothing here, and GPTConfig refuses them

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
    """Mixin for placements that end every block with a norm: the stream leaving the last block is already
    normalized, so there is no final norm."""

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

"""Weight initializations, chosen by name (``model.arch.init``).

An init rule sets every Linear and Embedding of the model, and says how the residual branches' output
projections are scaled with depth where the placement has no rule of its own (``Block.init_depth``:
DeepNorm's beta and LNS's plain init are the placements' own). Which init a comparison uses decides which of the
papers' mechanisms can appear: GPT-2's std 0.02 at width 128 is four times smaller than Xavier's, a regime where
post-norm's gradients at init are flat with depth.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from resnorm_lm.registry import Registry

if TYPE_CHECKING:
    from resnorm_lm.model.gpt import GPT

INITS: Registry[type[InitRule]] = Registry("init")


class InitRule:
    """Base class: ``init_weights(model)`` sets the weights; ``scale_branch_outputs`` is the depth rule."""

    def init_weights(self, model: GPT) -> None:
        raise NotImplementedError

    def scale_branch_outputs(self, attn: nn.Module, mlp: nn.Module, n_layer: int) -> None:
        """The residual branches' output projections at depth N (placements without a rule of their own)."""


@INITS.register("gpt2")
class GPT2Init(InitRule):
    """GPT-2's: every Linear and Embedding weight ~ N(0, 0.02), biases 0; residual output projections
    (attention and MLP ``c_proj``) ~ N(0, 0.02 / sqrt(2N))."""

    std = 0.02

    def init_weights(self, model: GPT) -> None:
        for module in model.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=self.std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=self.std)

    def scale_branch_outputs(self, attn: nn.Module, mlp: nn.Module, n_layer: int) -> None:
        std = self.std / math.sqrt(2 * n_layer)
        for proj in (attn.c_proj, mlp.c_proj):
            nn.init.normal_(proj.weight, mean=0.0, std=std)


@INITS.register("plain")
class PlainInit(GPT2Init):
    """GPT-2's N(0, 0.02) everywhere, without its depth scaling (LNS's matched baseline, arXiv 2502.05795)."""

    def scale_branch_outputs(self, attn: nn.Module, mlp: nn.Module, n_layer: int) -> None:
        pass


@INITS.register("xavier")
class XavierInit(InitRule):
    """As torchscale initializes its decoder (microsoft/torchscale, ``component/multihead_attention.py``,
    ``architecture/decoder.py``): q, k and v each Xavier-uniform with gain 1/sqrt(2), the attention output
    Xavier-uniform with a zero bias, the MLP's two Linears at PyTorch's default (Kaiming-uniform, a = sqrt(5)),
    token and position embeddings (and an untied head) ~ N(0, d^-1/2). No depth scaling."""

    def init_weights(self, model: GPT) -> None:
        for module in model.modules():
            if isinstance(module, nn.Linear) and module is not model.lm_head:
                module.reset_parameters()  # PyTorch's default: the MLP's, and the biases of q, k and v
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=module.embedding_dim**-0.5)
        if model.lm_head.weight is not model.wte.weight:  # untied: torchscale's output projection
            nn.init.normal_(model.lm_head.weight, mean=0.0, std=model.config.n_embd**-0.5)
        for block in model.blocks:
            attn = block.attn
            with torch.no_grad():
                for rows in attn.c_attn.weight.split(attn.n_embd):  # q, k, v: (C, C) each
                    nn.init.xavier_uniform_(rows, gain=1 / math.sqrt(2))
            nn.init.xavier_uniform_(attn.c_proj.weight)
            if attn.c_proj.bias is not None:
                nn.init.zeros_(attn.c_proj.bias)


@INITS.register("xavier_rescaled")
class XavierRescaledInit(XavierInit):
    """``xavier``, then every weight matrix of each block (q, k, v, the attention output and the MLP's two)
    multiplied by N^-1/2, biases and norms untouched: B2T's reference init (takase/b2t_connection,
    ``fairseq/modules/transformer_layer.py``, ``rescaling_init``, on fairseq's Xavier-initialized layers)."""

    def scale_branch_outputs(self, attn: nn.Module, mlp: nn.Module, n_layer: int) -> None:
        with torch.no_grad():
            for linear in (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj):
                linear.weight.mul_(n_layer**-0.5)

"""Module wrappers of the fused Triton Add & Norm kernels (``norm_backend: triton``).

Each subclasses the torch-backend module, so parameters, init and state-dict
keys are exactly torch's (gamma=1, beta=0; no bias parameter when bias=False),
and only ``forward`` and ``add_norm`` change: one kernel instead of two ops, called through
the custom operators of ``resnorm_lm.model.kernels.add_norm_ops`` (so torch.compile traces them).
"""

from __future__ import annotations

import torch

from resnorm_lm.model.kernels import add_norm_ops as kernels
from resnorm_lm.model.norms import AddNorm, LayerNorm, RMSNorm


class TritonLayerNorm(LayerNorm):
    """LayerNorm whose residual add and normalization are one fused kernel, forward and backward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.norm(x, self.weight, self.bias, self.eps, False)

    def add_norm(self, x: torch.Tensor, d: torch.Tensor) -> AddNorm:
        return AddNorm(*kernels.add_norm(x, d, self.weight, self.bias, self.eps, False))


class TritonRMSNorm(RMSNorm):
    """RMSNorm whose residual add and normalization are one fused kernel, forward and backward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.norm(x, self.weight, None, self.eps, True)

    def add_norm(self, x: torch.Tensor, d: torch.Tensor) -> AddNorm:
        return AddNorm(*kernels.add_norm(x, d, self.weight, None, self.eps, True))


TRITON_NORMS = {"layernorm": TritonLayerNorm, "rmsnorm": TritonRMSNorm}

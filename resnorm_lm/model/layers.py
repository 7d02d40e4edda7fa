"""The two sublayers of a block: causal self-attention and the MLP.

Each owns its weights' layout and says how its output projection is scaled at init (``scale_output``), so a
placement's init rule never reaches into a sublayer's fused weights.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

if TYPE_CHECKING:
    from resnorm_lm.model.gpt import GPTConfig

# The SDPA backend for CPU inputs of each dtype; a dtype not here gets SDPA's own choice. Set once per process by
# whoever measured which is fastest on this CPU (resnorm_lm/train/cpu_attention.py): torch's CPU flash kernel
# is the faster in fp32 but several times slower than the math backend in bf16 (docs/benchmarks.md).
CPU_SDPA_BACKENDS: dict[torch.dtype, SDPBackend] = {}


def use_cpu_sdpa_backend(dtype: torch.dtype, backend: SDPBackend | None) -> None:
    """Run attention on CPU tensors of ``dtype`` with ``backend`` where it can run, else the math backend (None:
    SDPA's own choice), in this process."""
    if backend is None:
        CPU_SDPA_BACKENDS.pop(dtype, None)
    else:
        CPU_SDPA_BACKENDS[dtype] = backend


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention`` (on CPU with the backend
    chosen for the dtype in ``CPU_SDPA_BACKENDS``)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.n_embd = cfg.n_embd
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v fused: rows [q; k; v]
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    @torch.no_grad()
    def scale_values_and_output(self, factor: float) -> None:
        """Multiply the value projection (v's rows of the fused weight and bias) and the output projection by
        ``factor``: the attention's share of DeepNorm's beta (q and k are left alone)."""
        self.c_attn.weight[2 * self.n_embd :].mul_(factor)  # (C, C): v's rows
        if self.c_attn.bias is not None:
            self.c_attn.bias[2 * self.n_embd :].mul_(factor)
        for tensor in (self.c_proj.weight, self.c_proj.bias):
            if tensor is not None:
                tensor.mul_(factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        dropout = self.dropout if self.training else 0.0
        # eager only: a compiled graph keeps Inductor's own choice (and no guard on this process-wide table)
        eager_cpu = q.device.type == "cpu" and not torch.compiler.is_compiling()
        backend = CPU_SDPA_BACKENDS.get(q.dtype) if eager_cpu else None
        # the chosen backend first, math where it cannot run (CPU flash has no dropout)
        preferred = sdpa_kernel([backend, SDPBackend.MATH], set_priority=True) if backend is not None else None
        with preferred or contextlib.nullcontext():
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward: C -> 4C -> GELU -> C."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    @torch.no_grad()
    def scale_weights(self, factor: float) -> None:
        """Multiply both Linears' weights and biases by ``factor``: the MLP's share of DeepNorm's beta."""
        for linear in (self.c_fc, self.c_proj):
            for tensor in (linear.weight, linear.bias):
                if tensor is not None:
                    tensor.mul_(factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))  # (B, T, 4C) inside

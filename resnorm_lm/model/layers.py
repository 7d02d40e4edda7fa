"""The two sublayers of a block: causal self-attention and the MLP, and the attention's QK-norm by name.

Each owns its weights' layout and says how its output projection is scaled at init (``scale_output``), so a
placement's init rule never reaches into a sublayer's fused weights. QK-norm is an option of the attention
(``model.arch.qk_norm``), orthogonal to the placement: every placement can have it.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from resnorm_lm.model.norms import RMSNorm
from resnorm_lm.registry import Registry

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


QK_NORMS: Registry[type[nn.Module]] = Registry("qk_norm")


@QK_NORMS.register("none")
class NoQKNorm(nn.Module):
    """Queries and keys as projected (GPT-2)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def logit_cap(self) -> float:
        """No bound on ``|q_h . k_h| / sqrt(head_dim)``: the logits grow with the weights."""
        return math.inf


@QK_NORMS.register("full")
class FullWidthQKNorm(nn.Module):
    """OLMo 2's QK-norm (OLMo et al. 2025, arXiv 2501.00656; allenai/OLMo-core ``use_head_qk_norm=False``): an
    RMSNorm over the whole query projection and one over the whole key projection, all heads together, before
    the heads are split::

        q = RMSNorm_q(x W_q),   k = RMSNorm_k(x W_k)      (over C = n_head * head_dim; weights (C,), init 1)
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.q_norm, self.k_norm = RMSNorm(cfg.n_embd, eps=cfg.norm_eps), RMSNorm(cfg.n_embd, eps=cfg.norm_eps)
        self.width, self.head_dim = cfg.n_embd, cfg.n_embd // cfg.n_head

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)  # (B, T, C) each

    def logit_cap(self) -> float:
        """The largest ``|q_h . k_h| / sqrt(head_dim)`` the gains allow: the normed q and k have ``||.||^2 <= C``
        over all heads, so by Cauchy-Schwarz ``|z| <= max_i |g_q,i g_k,i| * C / sqrt(head_dim)``, reached where one
        head holds all of q and k on one coordinate (at init C / sqrt(head_dim): 22.6 for 4 heads of 32)."""
        gains = (self.q_norm.weight * self.k_norm.weight).abs().max().item()
        return gains * self.width / math.sqrt(self.head_dim)


@QK_NORMS.register("per_head")
class PerHeadQKNorm(nn.Module):
    """QK-norm per head, as Qwen3 and Gemma 3 (and torchtitan's Qwen3) have it: an RMSNorm over each head's
    query and key, its weight shared by the heads (Dehghani et al. 2023, arXiv 2302.05442, normalise per head)::

        q_h = RMSNorm_q(q_h),   k_h = RMSNorm_k(k_h)      (over head_dim; weights (head_dim,), init 1)
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head, head_dim = cfg.n_head, cfg.n_embd // cfg.n_head
        self.q_norm, self.k_norm = RMSNorm(head_dim, eps=cfg.norm_eps), RMSNorm(head_dim, eps=cfg.norm_eps)
        self.head_dim = head_dim

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, C = q.shape
        heads = (B, T, self.n_head, C // self.n_head)
        q = self.q_norm(q.view(heads)).view(B, T, C)  # normed over each head's (B, T, nh, hs) last dimension
        return q, self.k_norm(k.view(heads)).view(B, T, C)

    def logit_cap(self) -> float:
        """The largest ``|q_h . k_h| / sqrt(head_dim)`` the gains allow: each head's normed q and k have
        ``||.||^2 <= head_dim``, so ``|z| <= max_i |g_q,i g_k,i| * sqrt(head_dim)``, reached on one coordinate (at
        init sqrt(head_dim): 5.66 for heads of 32, a quarter of the full-width norm's cap at 4 heads)."""
        return (self.q_norm.weight * self.k_norm.weight).abs().max().item() * math.sqrt(self.head_dim)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention`` (on CPU with the backend
    chosen for the dtype in ``CPU_SDPA_BACKENDS``), with the QK-norm named ``cfg.qk_norm`` on its queries and keys
    (none by default); the scale stays 1/sqrt(head_dim), as in OLMo 2."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.n_embd = cfg.n_embd
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v fused: rows [q; k; v]
        self.qk_norm = QK_NORMS.get(cfg.qk_norm)(cfg)
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
        q, k = self.qk_norm(q, k)  # (B, T, C) each
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

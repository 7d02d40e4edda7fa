"""Normalization layers, chosen by name, each offering the Add & Norm primitive.

Every norm maps (..., d) -> (..., d) over the last dimension and offers the
residual add followed by the norm, "Add & Norm": ``x, h = norm.add_norm(x, d)``
(``x = x + d;  h = norm(x)``, in that order), and ``norm.of_sum(x, d)``, just
``norm(x + d)``. The torch backend does it in two ops; a fused backend in one
kernel. Placements are written against these, so each gets the fused path
where its formula has an add followed by a norm.
"""

from __future__ import annotations

import importlib.util
import math
import os
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from resnorm_lm.errors import ResnormError
from resnorm_lm.registry import Registry

NORMS: Registry[type[Norm]] = Registry("norm")
NORM_BACKENDS: Registry[type[NormBackend]] = Registry("norm backend")


class AddNorm(NamedTuple):
    """``add_norm(x, d)``'s result, in the order of its formula: ``x = x + d``, then ``h = norm(x)``."""

    stream: torch.Tensor  # x + d (..., C): the residual stream after the add
    normed: torch.Tensor  # norm(x + d) (..., C)


class Norm(nn.Module):
    """Base class: ``forward(x)`` normalizes; ``add_norm`` fuses the residual add.

    Every norm takes ``eps`` and ``bias`` (one constructor for all); a norm without an epsilon or a bias ignores
    them, and says so in ``has_eps`` (``GPTConfig`` refuses a ``norm_eps`` such a norm would ignore) and in its
    docstring (``bias`` still sets the Linear layers' biases).
    """

    needs_roles = False  # True: its init depends on what the norm feeds (``for_role``); the placement must say
    has_eps = True  # False: eps is not in its formula

    @classmethod
    def for_role(cls, role: str | None, dim: int, *, eps: float = 1e-5, bias: bool = True) -> Norm:
        """A norm that feeds ``role`` ("attention", "mlp", "final", or None where the placement does not say)."""
        return cls(dim, eps=eps, bias=bias)

    @classmethod
    def input_scale(cls, dim: int) -> nn.Module:
        """What the model applies to its embeddings (B, T, C) before block 0: nothing, for a norm."""
        return nn.Identity()

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        if dim < 1:
            raise ValueError(f"norm dimension must be >= 1, got {dim}")
        if not eps > 0:
            raise ValueError(f"norm eps must be > 0, got {eps}")
        self.dim = dim
        self.eps = eps

    def add_norm(self, x: torch.Tensor, d: torch.Tensor) -> AddNorm:
        """``x + d`` and ``norm(x + d)``; x is the residual stream, d a sublayer output (B, T, C) each."""
        x = x + d  # (B, T, C)
        return AddNorm(x, self(x))

    def of_sum(self, x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """``norm(x + d)``: post-norm's "Add & Norm", through ``add_norm`` (fused where the backend fuses)."""
        return self.add_norm(x, d).normed

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


@NORMS.register("layernorm")
class LayerNorm(Norm):
    """``gamma * (x - mean) / sqrt(var + eps) + beta`` with the biased variance (Ba et al. 2016, arXiv 1607.06450)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__(dim, eps, bias)
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)


@NORMS.register("rmsnorm")
class RMSNorm(Norm):
    """``gamma * x / sqrt(mean(x^2) + eps)`` (Zhang & Sennrich 2019, arXiv 1910.07467). Never has a bias: ``bias``
    sets only the Linear layers'."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__(dim, eps, bias)
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)


@NORMS.register("scalenorm")
class ScaleNorm(Norm):
    """``g * x / max(||x||, eps)`` with one learnable scalar g, init sqrt(d) (Nguyen & Salazar 2019, arXiv
    1910.05895). Never has a bias: ``bias`` sets only the Linear layers'."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__(dim, eps, bias)
        self.gain = nn.Parameter(torch.tensor(math.sqrt(dim)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = x.float().norm(dim=-1, keepdim=True).clamp_min(self.eps)  # (..., 1), fp32
        return (x.float() * (self.gain / norm)).to(x.dtype)


@NORMS.register("dyt")
class DynamicTanh(Norm):
    """DyT ``gamma * tanh(alpha * x) + beta``, scalar alpha init 0.5 (Zhu et al. 2025, arXiv 2503.10622). No
    statistics, so no eps."""

    has_eps = False

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, alpha_init: float = 0.5) -> None:
        super().__init__(dim, eps, bias)
        self.alpha = nn.Parameter(torch.tensor(alpha_init))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fp32 math: in bf16 the reduction behind d(alpha) over all elements loses ~25%.
        y = self.weight.float() * torch.tanh(self.alpha.float() * x.float())
        y = y + self.bias.float() if self.bias is not None else y
        return y.to(x.dtype)


@NORMS.register("dyt_llm")
class DynamicTanhLLM(DynamicTanh):
    """DyT as its authors train LLaMA (jiachenzhu/DyT, ``other_tasks/LLaMA``): ``gamma * tanh(alpha * x)``, no
    bias; alpha init 0.8 in the norms before attention and 0.2 before the MLP and at the end (their LLaMA-2 7B
    setting, the smallest they publish); and a learnable scalar on the embeddings, init sqrt(d). ``bias`` sets only
    the Linear layers'."""

    needs_roles = True
    ALPHA_INIT = {"attention": 0.8, "mlp": 0.2, "final": 0.2}  # by the sublayer the norm feeds

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, alpha_init: float = 0.2) -> None:
        super().__init__(dim, eps, bias=False, alpha_init=alpha_init)  # the reference has no bias

    @classmethod
    def for_role(cls, role: str | None, dim: int, *, eps: float = 1e-5, bias: bool = True) -> Norm:
        if role not in cls.ALPHA_INIT:
            raise ValueError(
                f"norm 'dyt_llm' sets alpha by what each norm feeds ({', '.join(cls.ALPHA_INIT)}); got {role!r}"
            )
        return cls(dim, eps=eps, alpha_init=cls.ALPHA_INIT[role])

    @classmethod
    def input_scale(cls, dim: int) -> nn.Module:
        return LearnedScalar(math.sqrt(dim))


@NORMS.register("dyt_lnout")
class DynamicTanhLayerNormReadout(DynamicTanh):
    """DyT (alpha 0.5, with bias) in the blocks and a LayerNorm at the readout: a diagnostic, not a paper's
    setting. It shows where DyT loses a small LM: pre-norm's stream grows to an RMS of tens, the readout's tanh
    saturates, and no gradient reaches the blocks through it (docs/results.md, "The norms at 12 layers")."""

    needs_roles = True
    has_eps = True  # its readout's LayerNorm

    @classmethod
    def for_role(cls, role: str | None, dim: int, *, eps: float = 1e-5, bias: bool = True) -> Norm:
        if role == "final":
            return LayerNorm(dim, eps=eps, bias=bias)
        return cls(dim, eps=eps, bias=bias)


@NORMS.register("dyt_paper")
class DynamicTanhPaper(DynamicTanhLLM):
    """DyT set up as its paper trains LLaMA, at this model's width (Zhu et al. 2025, arXiv 2503.10622, section 7;
    jiachenzhu/DyT ``other_tasks/LLaMA``): ``gamma * tanh(alpha * x)``, no bias, a learnable scalar on the
    embeddings, init sqrt(d) (at width 128 under GPT-2's init the stream starts at RMS 0.32, not 0.028); alpha by
    width, attention > FFN, the final norm taking the FFN's. Their code gives 0.8/0.2 at width 4096, 0.6/0.15 at
    5120, 0.2/0.05 at 8192; the paper's width table gives 1.0/1.0 at its narrowest width, 1024 (its image could not
    be read here: the value is that of secondary summaries), which is used at every width up to 1024. The recipe
    (prenorm-12l-dyt-paper) adds the rest of their setup: no Linear biases and an untied head."""

    ALPHA_BY_WIDTH = ((1024, 1.0, 1.0), (4096, 0.8, 0.2), (5120, 0.6, 0.15), (8192, 0.2, 0.05))  # (width <=, attn, ffn)

    @classmethod
    def for_role(cls, role: str | None, dim: int, *, eps: float = 1e-5, bias: bool = True) -> Norm:
        if role not in ("attention", "mlp", "final"):
            raise ValueError(f"norm {cls.__name__} sets alpha by what each norm feeds (attention, mlp, final)")
        _, attention, mlp = next((row for row in cls.ALPHA_BY_WIDTH if dim <= row[0]), cls.ALPHA_BY_WIDTH[-1])
        return cls(dim, eps=eps, alpha_init=attention if role == "attention" else mlp)


@NORMS.register("dyt_paper_unscaled")
class DynamicTanhPaperUnscaled(DynamicTanhPaper):
    """``dyt_paper`` without the learnable sqrt(d) on the embeddings: the stream starts at GPT-2's init (RMS ~0.03
    at width 128) as the repository's first DyT did. A diagnostic arm: is the paper's embedding scale what lets
    DyT learn here (docs/designs.md)?"""

    @classmethod
    def input_scale(cls, dim: int) -> nn.Module:
        return nn.Identity()


@NORMS.register("dyt_rms_readout")
class DynamicTanhRMSReadout(DynamicTanhPaper):
    """``dyt_paper`` in the blocks, and at the readout a DyT whose alpha is set at every forward pass to 1/RMS of
    its input (the batch's, not learned): the experiment that asks whether DyT loses a small LM only because the
    readout's tanh saturates as the stream grows (docs/designs.md). A diagnostic arm, not a paper's setting."""

    @classmethod
    def for_role(cls, role: str | None, dim: int, *, eps: float = 1e-5, bias: bool = True) -> Norm:
        return RMSScaledTanh(dim) if role == "final" else super().for_role(role, dim, eps=eps, bias=bias)


class RMSScaledTanh(Norm):
    """``gamma * tanh(x / RMS(x))``, the RMS over the whole input (B, T, C), treated as a constant: a tanh that
    cannot saturate because its input grows."""

    has_eps = False

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__(dim, eps, bias)
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = x.detach().float().square().mean().rsqrt()  # 0-dim: 1 / RMS of the batch's input
        return (self.weight.float() * torch.tanh(alpha * x.float())).to(x.dtype)


@NORMS.register("derf")
class DynamicErf(Norm):
    """Derf ``gamma * erf(alpha * x + s) + beta`` (Chen et al. 2025, "Stronger Normalization-Free Transformers",
    arXiv 2512.10938; zlab-princeton/Derf), scalar alpha and shift s, gamma and beta per channel. As its authors
    set up GPT-2 (``language model/model_derf.patch``): alpha init 1.0 in every norm (their module's default,
    0.5, is their ViT's) and a learnable scalar, init sqrt(d), on the token + position embeddings. No
    statistics, so no eps."""

    has_eps = False

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, alpha_init: float = 1.0) -> None:
        super().__init__(dim, eps, bias)
        self.alpha = nn.Parameter(torch.tensor(alpha_init))
        self.shift = nn.Parameter(torch.tensor(0.0))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    @classmethod
    def input_scale(cls, dim: int) -> nn.Module:
        return LearnedScalar(math.sqrt(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.weight.float() * torch.erf(self.alpha.float() * x.float() + self.shift.float())  # fp32, as DyT
        y = y + self.bias.float() if self.bias is not None else y
        return y.to(x.dtype)


class LearnedScalar(nn.Module):
    """``g * x`` with one learnable scalar g."""

    def __init__(self, init: float) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.tensor(float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain.to(x.dtype)  # (..., C)


@NORMS.register("none")
class NoNorm(Norm):
    """The identity: a placement's norms switched off (its add stays)."""

    has_eps = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class NormBackend:
    """How a named norm is computed: picks the class that implements ``norm`` on this backend."""

    @classmethod
    def norm_class(cls, norm: str) -> type[Norm]:
        raise NotImplementedError

    @classmethod
    def check_available(cls) -> None:
        """Raise a clear error at config time when this backend cannot run here."""


@NORM_BACKENDS.register("torch")
class TorchBackend(NormBackend):
    """Plain PyTorch ops: the add and the norm are two kernels."""

    @classmethod
    def norm_class(cls, norm: str) -> type[Norm]:
        return NORMS.get(norm)


class BackendUnavailableError(ResnormError, ValueError):
    """A norm backend that cannot run on this machine, or a norm it does not implement."""


@NORM_BACKENDS.register("triton")
class TritonBackend(NormBackend):
    """Fused Triton Add & Norm kernels (layernorm, rmsnorm): one pass over memory, forward and backward."""

    norms = ("layernorm", "rmsnorm")

    @classmethod
    def check_available(cls) -> None:
        if importlib.util.find_spec("triton") is None:
            raise BackendUnavailableError(
                "norm_backend 'triton' needs the triton package: pip install 'resnorm-lm[triton]' "
                "(make install includes it), or use norm_backend: torch"
            )
        if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            raise BackendUnavailableError(
                "norm_backend 'triton' needs a CUDA GPU (or TRITON_INTERPRET=1, set before start-up, to run the "
                "kernels in Triton's CPU interpreter for testing); on this machine use norm_backend: torch"
            )

    @classmethod
    def norm_class(cls, norm: str) -> type[Norm]:
        if norm not in cls.norms:
            raise BackendUnavailableError(
                f"norm_backend 'triton' implements {' and '.join(cls.norms)}, not {norm!r}; "
                f"use norm_backend: torch for {norm}"
            )
        cls.check_available()
        from resnorm_lm.model.norms_triton import TRITON_NORMS  # imports triton: only when chosen

        return TRITON_NORMS[norm]


def check_norm_choice(norm: str, backend: str) -> None:
    """Validate a (norm, backend) pair without building anything: errors list valid names."""
    NORMS.get(norm)
    backend_cls = NORM_BACKENDS.get(backend)
    backend_cls.check_available()
    backend_cls.norm_class(norm)


def build_norm(
    norm: str, dim: int, *, backend: str = "torch", eps: float = 1e-5, bias: bool = True, role: str | None = None
) -> Norm:
    """The norm named ``norm`` on ``backend``, over a last dimension of size ``dim``, feeding ``role`` (where the
    placement says: "attention", "mlp" or "final")."""
    NORMS.get(norm)  # unknown names fail with the list of valid ones, whatever the backend
    norm_cls = NORM_BACKENDS.get(backend).norm_class(norm)
    return norm_cls(dim, eps=eps, bias=bias) if role is None else norm_cls.for_role(role, dim, eps=eps, bias=bias)

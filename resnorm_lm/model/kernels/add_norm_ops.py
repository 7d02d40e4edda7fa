"""The fused Add & Norm kernels as PyTorch custom operators (``torch.library.triton_op``).

As operators with a fake-tensor implementation and a registered autograd formula,
torch.compile sees them as single graph nodes: Dynamo never traces into the Triton
launch (whose Python launch code cannot take symbolic sizes: a new batch shape used
to crash compiled evaluation), shapes may be dynamic, and the backward is ours.
Being ``triton_op``s whose launches go through ``torch.library.wrap_triton``, each is
then decomposed by AOTAutograd into its kernel launch (``triton_kernel_wrapper_functional``
with a symbolic grid), so Inductor launches the kernels from its generated code, not
through a Python call per kernel. Under the interpreter (``TRITON_INTERPRET=1``) a
kernel cannot be captured that way, so they stay opaque ``custom_op``s there.

    resnorm_lm::add_norm_fwd(x, d, weight, bias?, eps, is_rms, residual_dtype?) -> (y, s, mean, rstd)
    resnorm_lm::norm_fwd(x, weight, bias?, eps, is_rms) -> (y, mean, rstd)
    resnorm_lm::add_norm_bwd(dy, ds?, s, weight, bias?, mean, rstd, is_rms, x_dtype) -> (dx, dw, db)

``mean`` is empty for RMSNorm and ``db`` empty without a bias: operators return tensors, never None.
"""

from __future__ import annotations

import torch
from torch import Tensor

from resnorm_lm.model.kernels.add_norm import INTERPRETING, add_norm_backward, add_norm_forward

EMPTY = (0,)
# triton_op: traced into its kernel launches by torch.compile; the interpreter's kernels cannot be traced
operator = torch.library.custom_op if INTERPRETING else torch.library.triton_op
wrap = torch.library.wrap_triton


def _rows(x: Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


# ---------------------------------------------------------------------- forward with the residual add


@operator("resnorm_lm::add_norm_fwd", mutates_args=())
def add_norm_fwd(
    x: Tensor,
    d: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    eps: float,
    is_rms: bool,
    residual_dtype: torch.dtype | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    y, s, mean, rstd = add_norm_forward(x, d, weight, bias, eps, is_rms, residual_dtype, wrap)
    return y, s, mean if mean is not None else rstd.new_empty(EMPTY), rstd


@add_norm_fwd.register_fake
def _(x, d, weight, bias, eps, is_rms, residual_dtype):
    s_dtype = residual_dtype or torch.promote_types(x.dtype, d.dtype)
    m = _rows(x)
    stats = x.new_empty((m,), dtype=torch.float32)
    mean = x.new_empty(EMPTY if is_rms else (m,), dtype=torch.float32)
    return x.new_empty(x.shape, dtype=s_dtype), x.new_empty(x.shape, dtype=s_dtype), mean, stats


def _add_norm_setup(ctx, inputs, output) -> None:
    x, d, weight, bias, _eps, is_rms, _ = inputs
    _y, s, mean, rstd = output
    ctx.save_for_backward(s, weight, bias, mean, rstd)
    ctx.is_rms, ctx.dtypes = is_rms, (x.dtype, d.dtype)
    ctx.mark_non_differentiable(mean, rstd)


def _add_norm_backward(ctx, dy, ds, _dmean, _drstd):
    s, weight, bias, mean, rstd = ctx.saved_tensors
    x_dtype, d_dtype = ctx.dtypes
    dx, dw, db = add_norm_bwd(dy, ds, s, weight, bias, mean, rstd, ctx.is_rms, x_dtype)
    dd = dx if d_dtype == x_dtype else dx.to(d_dtype)  # s = x + d: the same gradient reaches both
    return dx, dd, dw, db if bias is not None else None, None, None, None


add_norm_fwd.register_autograd(_add_norm_backward, setup_context=_add_norm_setup)


# ---------------------------------------------------------------------- forward without it


@operator("resnorm_lm::norm_fwd", mutates_args=())
def norm_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float, is_rms: bool) -> tuple[Tensor, Tensor, Tensor]:
    y, _, mean, rstd = add_norm_forward(x, None, weight, bias, eps, is_rms, None, wrap)
    return y, mean if mean is not None else rstd.new_empty(EMPTY), rstd


@norm_fwd.register_fake
def _(x, weight, bias, eps, is_rms):
    m = _rows(x)
    mean = x.new_empty(EMPTY if is_rms else (m,), dtype=torch.float32)
    return x.new_empty(x.shape), mean, x.new_empty((m,), dtype=torch.float32)


def _norm_setup(ctx, inputs, output) -> None:
    x, weight, bias, _eps, is_rms = inputs
    _y, mean, rstd = output
    ctx.save_for_backward(x, weight, bias, mean, rstd)
    ctx.is_rms = is_rms
    ctx.mark_non_differentiable(mean, rstd)


def _norm_backward(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    dx, dw, db = add_norm_bwd(dy, None, x, weight, bias, mean, rstd, ctx.is_rms, x.dtype)
    return dx, dw, db if bias is not None else None, None, None


norm_fwd.register_autograd(_norm_backward, setup_context=_norm_setup)


# ---------------------------------------------------------------------- backward


@operator("resnorm_lm::add_norm_bwd", mutates_args=())
def add_norm_bwd(
    dy: Tensor,
    ds: Tensor | None,
    s: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    is_rms: bool,
    x_dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = add_norm_backward(dy, ds, s, weight, bias, None if is_rms else mean, rstd, is_rms, x_dtype, wrap)
    return dx, dw, db if db is not None else weight.new_empty(EMPTY)


@add_norm_bwd.register_fake
def _(dy, ds, s, weight, bias, mean, rstd, is_rms, x_dtype):
    db = bias.new_empty(bias.shape) if bias is not None else weight.new_empty(EMPTY)
    return s.new_empty(s.shape, dtype=x_dtype), weight.new_empty(weight.shape), db


# ---------------------------------------------------------------------- the eager fast path


class _AddNormFunction(torch.autograd.Function):
    """The same kernels without the operator dispatch: in eager mode a custom operator's Python wrapper,
    schema handling and autograd registration cost more host time per call than the launch itself
    (docs/benchmarks.md); torch.compile still sees the operators (``add_norm`` below picks)."""

    @staticmethod
    def forward(ctx, x, d, weight, bias, eps, is_rms, residual_dtype):
        y, s, mean, rstd = add_norm_forward(x, d, weight, bias, eps, is_rms, residual_dtype)
        ctx.save_for_backward(s, weight, bias, mean, rstd)
        ctx.is_rms, ctx.dtypes = is_rms, (x.dtype, None if d is None else d.dtype)
        ctx.set_materialize_grads(False)  # an unused s (or y) sends None: no zeros to read
        return (y, s) if d is not None else y

    @staticmethod
    def backward(ctx, dy, ds=None):
        s, weight, bias, mean, rstd = ctx.saved_tensors
        x_dtype, d_dtype = ctx.dtypes
        if dy is None:
            dy = torch.zeros_like(s)
        dx, dw, db = add_norm_backward(dy, ds, s, weight, bias, mean, rstd, ctx.is_rms, x_dtype)  # dx: like s
        dd = None if d_dtype is None else (dx if d_dtype == x_dtype else dx.to(d_dtype))
        return dx, dd, dw, db, None, None, None


# ---------------------------------------------------------------------- what the modules call


def add_norm(
    x: Tensor,
    d: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    eps: float,
    is_rms: bool,
    residual_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """``(x + d, norm(x + d))``, in the order of the formula (as ``Norm.add_norm``), in one fused kernel, forward
    and backward."""
    if torch.compiler.is_compiling():  # one opaque graph node with a fake-tensor rule: dynamic shapes work
        y, s, _, _ = add_norm_fwd(x, d, weight, bias, float(eps), is_rms, residual_dtype)
        return s, y
    y, s = _AddNormFunction.apply(x, d, weight, bias, float(eps), is_rms, residual_dtype)
    return s, y


def norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float, is_rms: bool) -> Tensor:
    """``norm(x)`` with the same kernels."""
    if torch.compiler.is_compiling():
        return norm_fwd(x, weight, bias, float(eps), is_rms)[0]
    return _AddNormFunction.apply(x, None, weight, bias, float(eps), is_rms, None)

"""Fused "Add & Norm" Triton kernels: s = x + d, y = norm(s), forward and backward, LayerNorm and RMSNorm.

One pass over memory each way: the forward reads x and d once and writes y and s;
the backward reads dy, s (and the incoming gradient of s) once and writes dx.
Statistics are fp32 whatever the input dtype; mean and rstd are saved in fp32.
dW and dB are reduced without locks: each program writes one fp32 partial row,
and a torch sum over programs finishes the reduction (deterministic).

Set ``TRITON_INTERPRET=1`` before importing this module to run it on CPU tensors.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

MAX_ROW_BYTES = 65536  # a row must fit one program's tile: 64 KB, as in the reference kernels
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _add_norm_fwd(
    X,  # (M, N) stream x, any float dtype; row stride stride_x
    D,  # (M, N) sublayer output d (unused when HAS_D is False)
    S,  # (M, N) out: s = x + d (written when STORE_S)
    Y,  # (M, N) out: y = norm(s)
    W,  # (N,) gamma
    B,  # (N,) beta (unused when HAS_BIAS is False)
    Mean,  # (M,) out, fp32 (unused for RMSNorm)
    Rstd,  # (M,) out, fp32: 1 / sqrt(var + eps)
    stride_x,
    stride_d,
    stride_s,
    stride_y,
    M,  # rows
    N,  # hidden size
    eps,  # a Python float: Triton passes float scalars as fp32, so var + eps stays fp32
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # next power of two >= N
    IS_RMS: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    STORE_S: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    cols = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    row_ok = rows < M
    mask = row_ok[:, None] & (cols[None, :] < N)  # (BLOCK_M, BLOCK_N)
    rows64 = rows.to(tl.int64)  # row * stride overflows int32 on large tensors

    s = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_D:
        s += tl.load(D + rows64[:, None] * stride_d + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if STORE_S:
        tl.store(S + rows64[:, None] * stride_s + cols[None, :], s.to(S.dtype.element_ty), mask=mask)

    if IS_RMS:
        centered = s
    else:
        mean = tl.sum(s, axis=1) / N  # (BLOCK_M,)
        tl.store(Mean + rows64, mean, mask=row_ok)
        centered = tl.where(mask, s - mean[:, None], 0.0)
    var = tl.sum(centered * centered, axis=1) / N  # biased variance (or mean square for RMSNorm)
    rstd = 1.0 / tl.sqrt(var + eps)  # (BLOCK_M,)
    tl.store(Rstd + rows64, rstd, mask=row_ok)

    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = centered * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        y += tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rows64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _add_norm_bwd(
    DY,  # (M, N) gradient of y
    DS,  # (M, N) incoming gradient of s (unused when HAS_DS is False)
    S,  # (M, N) the saved sum s
    W,  # (N,) gamma
    Mean,  # (M,) fp32 (unused for RMSNorm)
    Rstd,  # (M,) fp32
    DX,  # (M, N) out: gradient of x, which is also the gradient of d
    DW,  # (P, N) out: fp32 partial dW, one row per program
    DB,  # (P, N) out: fp32 partial dB (unused when HAS_BIAS is False)
    stride_dy,
    stride_ds,
    stride_s,
    stride_dx,
    M,
    N,
    tiles_per_program,  # row tiles each program walks through
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_RMS: tl.constexpr,
    HAS_DS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for t in range(0, tiles_per_program):
        rows = (pid * tiles_per_program + t) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        rows64 = rows.to(tl.int64)
        mask = row_ok[:, None] & col_ok[None, :]
        s = tl.load(S + rows64[:, None] * stride_s + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + rows64, mask=row_ok, other=0.0)
        if IS_RMS:
            xhat = s * rstd[:, None]
        else:
            mean = tl.load(Mean + rows64, mask=row_ok, other=0.0)
            xhat = tl.where(mask, (s - mean[:, None]) * rstd[:, None], 0.0)
        wdy = w[None, :] * dy  # (BLOCK_M, BLOCK_N)
        c1 = tl.sum(xhat * wdy, axis=1) / N
        if IS_RMS:
            dx = (wdy - xhat * c1[:, None]) * rstd[:, None]
        else:
            c2 = tl.sum(wdy, axis=1) / N
            dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        if HAS_DS:
            dx += tl.load(DS + rows64[:, None] * stride_ds + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + rows64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * xhat, axis=0)
        if HAS_BIAS:
            db += tl.sum(dy, axis=0)
    tl.store(DW + pid * N + cols, dw, mask=col_ok)
    if HAS_BIAS:
        tl.store(DB + pid * N + cols, db, mask=col_ok)


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """A (M, N) view with unit stride along N (a copy only when the input needs one)."""
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


@functools.lru_cache(maxsize=1024)  # called on every launch: host time per call matters at small shapes
def launch_config(n_rows: int, n: int, elem_size: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): the row tile and warps for a hidden size, by heuristic."""
    if n * elem_size > MAX_ROW_BYTES:
        raise ValueError(
            f"the fused Add & Norm kernel handles rows up to {MAX_ROW_BYTES} bytes; hidden size {n} in "
            f"{elem_size}-byte elements is {n * elem_size} bytes: use norm_backend: torch"
        )
    block_n = triton.next_power_of_2(n)
    # interpreting, time is per program: take big tiles; on a GPU keep a tile near 4-16K elements
    budget = 65536 if INTERPRETING else 8192
    block_m = max(1, min(triton.next_power_of_2(max(n_rows, 1)), budget // block_n, 128 if INTERPRETING else 16))
    num_warps = min(max(block_m * block_n // 512, 1), 16)
    return block_m, block_n, num_warps


def add_norm_forward(x, d, weight, bias, eps: float, is_rms: bool, residual_dtype=None):
    """Returns y, s (both shaped like x), mean (M,) or None, rstd (M,), and the 2D s for backward."""
    n = x.shape[-1]
    x2 = _rows(x, n)
    d2 = _rows(d, n) if d is not None else None
    if d2 is not None and d2.shape != x2.shape:
        raise ValueError(f"x {tuple(x.shape)} and d {tuple(d.shape)} must have the same shape")
    m = x2.shape[0]
    s_dtype = residual_dtype or (torch.promote_types(x.dtype, d.dtype) if d is not None else x.dtype)
    y2 = torch.empty((m, n), dtype=s_dtype, device=x.device)
    store_s = d is not None or s_dtype != x.dtype
    s2 = torch.empty((m, n), dtype=s_dtype, device=x.device) if store_s else x2
    mean = torch.empty((m,), dtype=torch.float32, device=x.device) if not is_rms else None
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    block_m, block_n, num_warps = launch_config(m, n, max(x.element_size(), s2.element_size()))
    if m > 0:
        _add_norm_fwd[(triton.cdiv(m, block_m),)](
            x2, d2 if d2 is not None else x2, s2, y2, weight, bias if bias is not None else weight,
            mean if mean is not None else rstd, rstd,
            x2.stride(0), d2.stride(0) if d2 is not None else 0, s2.stride(0), y2.stride(0),
            m, n, float(eps),
            BLOCK_M=block_m, BLOCK_N=block_n, IS_RMS=is_rms, HAS_D=d is not None,
            HAS_BIAS=bias is not None, STORE_S=store_s, num_warps=num_warps,
        )  # fmt: skip
    return y2.view(x.shape), s2.view(x.shape), mean, rstd, s2


def _programs(n_tiles: int, device: torch.device) -> int:
    if INTERPRETING or device.type != "cuda":
        return min(n_tiles, 4)
    return min(n_tiles, 4 * _multiprocessors(device.index if device.index is not None else 0))


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def add_norm_backward(dy, ds, s2, weight, bias, mean, rstd, is_rms: bool, x_dtype):
    """Returns dx (M, N) in ``x_dtype``, dW (N,) and dB (N,) or None, in the parameters' dtypes."""
    m, n = s2.shape
    dy2 = _rows(dy, n)
    ds2 = _rows(ds, n) if ds is not None else None
    dx = torch.empty((m, n), dtype=x_dtype, device=s2.device)
    block_m, block_n, num_warps = launch_config(m, n, s2.element_size())
    n_tiles = triton.cdiv(m, block_m)
    programs = max(_programs(n_tiles, s2.device), 1)
    tiles_per_program = triton.cdiv(n_tiles, programs)
    dw_part = torch.empty((programs, n), dtype=torch.float32, device=s2.device)
    db_part = torch.empty((programs, n), dtype=torch.float32, device=s2.device) if bias is not None else None
    if m > 0:
        _add_norm_bwd[(programs,)](
            dy2, ds2 if ds2 is not None else dy2, s2, weight, mean if mean is not None else rstd, rstd,
            dx, dw_part, db_part if db_part is not None else dw_part,
            dy2.stride(0), ds2.stride(0) if ds2 is not None else 0, s2.stride(0), dx.stride(0),
            m, n, tiles_per_program,
            BLOCK_M=block_m, BLOCK_N=block_n, IS_RMS=is_rms, HAS_DS=ds is not None,
            HAS_BIAS=bias is not None, num_warps=num_warps,
        )  # fmt: skip
    else:
        dw_part.zero_()
        if db_part is not None:
            db_part.zero_()
    dw = dw_part.sum(0).to(weight.dtype)
    db = db_part.sum(0).to(bias.dtype) if bias is not None else None
    return dx, dw, db

"""Fused "Add & Norm" Triton kernels: s = x + d, y = norm(s), forward and backward, LayerNorm and RMSNorm.

One pass over memory each way: the forward reads x and d once and writes y and s;
the backward reads dy, s (and the incoming gradient of s) once and writes dx.
Statistics are fp32 whatever the input dtype; mean and rstd are saved in fp32.
The backward is persistent (a fixed number of programs, from the multiprocessor count, each
walking row tiles); each program keeps its dW and dB partials as a 2D fp32 tile in registers
and reduces them across rows once at the end, writing one fp32 partial row; a torch sum over
programs finishes the reduction. No locks or atomics: deterministic.

Set ``TRITON_INTERPRET=1`` before importing this module to run it on CPU tensors.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner

MAX_ROW_BYTES = 65536  # a row must fit one program's tile: 64 KB, as in the reference kernels
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _add_norm_fwd(
    X,  # (M, N) stream x, any float dtype; every (M, N) tensor here is contiguous (row stride N)
    D,  # (M, N) sublayer output d (unused when HAS_D is False)
    S,  # (M, N) out: s = x + d (written when STORE_S)
    Y,  # (M, N) out: y = norm(s)
    W,  # (N,) gamma
    B,  # (N,) beta (unused when HAS_BIAS is False)
    Mean,  # (M,) out, fp32 (unused for RMSNorm)
    Rstd,  # (M,) out, fp32: 1 / sqrt(var + eps)
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
    rows64 = rows.to(tl.int64)  # row * N overflows int32 on large tensors

    s = tl.load(X + rows64[:, None] * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_D:
        s += tl.load(D + rows64[:, None] * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if STORE_S:
        tl.store(S + rows64[:, None] * N + cols[None, :], s.to(S.dtype.element_ty), mask=mask)

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
    tl.store(Y + rows64[:, None] * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _add_norm_bwd(
    DY,  # (M, N) gradient of y
    DS,  # (M, N) incoming gradient of s (unused when HAS_DS is False)
    S,  # (M, N) the saved sum s
    W,  # (N,) gamma
    Mean,  # (M,) fp32 (unused for RMSNorm)
    Rstd,  # (M,) fp32
    DX,  # (M, N) out: gradient of x, which is also the gradient of d
    DW,  # (P, N) out: fp32 partial dW, one row per program (P = the grid)
    DB,  # (P, N) out: fp32 partial dB (unused when HAS_BIAS is False)
    M,
    N,
    BLOCK_M: tl.constexpr,  # rows per tile
    BLOCK_N: tl.constexpr,
    IS_RMS: tl.constexpr,
    HAS_DS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    # persistent: program p walks row tiles p, p + P, p + 2P, ... (a fixed order: deterministic)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    # dW and dB partials stay 2D in registers across tiles: one cross-row reduction at the end, not one per tile
    dw = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    db = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for tile in range(pid, tl.cdiv(M, BLOCK_M), programs):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        row_ok = rows < M
        rows64 = rows.to(tl.int64)
        mask = row_ok[:, None] & col_ok[None, :]  # (BLOCK_M, BLOCK_N)
        s = tl.load(S + rows64[:, None] * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows64[:, None] * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + rows64, mask=row_ok, other=0.0)
        if IS_RMS:
            xhat = s * rstd[:, None]
        else:
            mean = tl.load(Mean + rows64, mask=row_ok, other=0.0)
            xhat = tl.where(mask, (s - mean[:, None]) * rstd[:, None], 0.0)
        wdy = w[None, :] * dy  # (BLOCK_M, BLOCK_N)
        c1 = tl.sum(xhat * wdy, axis=1) / N  # (BLOCK_M,)
        if IS_RMS:
            dx = (wdy - xhat * c1[:, None]) * rstd[:, None]
        else:
            c2 = tl.sum(wdy, axis=1) / N
            dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        if HAS_DS:
            dx += tl.load(DS + rows64[:, None] * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + rows64[:, None] * N + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
        if HAS_BIAS:
            db += dy
    # every program writes its whole partial row (zeros if it had no tile): stores only, safe to re-run
    tl.store(DW + pid * N + cols, tl.sum(dw, axis=0), mask=col_ok)
    if HAS_BIAS:
        tl.store(DB + pid * N + cols, tl.sum(db, axis=0), mask=col_ok)


def _identity(kernel):
    return kernel


# ---------------------------------------------------------------------- launch configurations
#
# On a GPU, triton.autotune picks (BLOCK_M, num_warps) once per width and variant, among the few configs
# whose tile suits the width. Under the interpreter (and when torch.use_deterministic_algorithms is on, so
# that two processes pick the same tiles and hence the same summation order), a fixed heuristic picks them.
# Autotuning runs a kernel several times on the real arguments: both kernels only store (nothing is
# accumulated into an output, and no input is written), so no restore_value / reset_to_zero is needed.

FWD_TILE = (2048, 16384)  # elements per program: enough rows in flight at small widths, no spills at large ones
BWD_TILE = (1024, 8192)  # the backward keeps two more (BLOCK_M, BLOCK_N) fp32 accumulators in registers
CONFIGS = [triton.Config({"BLOCK_M": m}, num_warps=w) for m in (1, 2, 4, 8, 16, 32) for w in (4, 8, 16)]


def _block_n(n: int, elem_size: int) -> int:
    if n * elem_size > MAX_ROW_BYTES:
        raise ValueError(
            f"the fused Add & Norm kernel handles rows up to {MAX_ROW_BYTES} bytes; hidden size {n} in "
            f"{elem_size}-byte elements is {n * elem_size} bytes: use norm_backend: torch"
        )
    return triton.next_power_of_2(n)


def _fits(block_m: int, block_n: int, num_warps: int, tile: tuple[int, int]) -> bool:
    """A tile within ``tile`` elements (one row when a row alone is bigger), 16-32 elements of it per thread:
    2-6 configs per width, so autotuning compiles a handful of kernels per width and variant."""
    elements = block_m * block_n
    in_range = tile[0] <= elements <= tile[1] or (block_m == 1 and block_n >= tile[0])
    return in_range and 16 <= elements // (32 * num_warps) <= 32


def _prune(tile):
    def prune(configs, named_args, **kwargs):
        block_n = kwargs.get("BLOCK_N", named_args.get("BLOCK_N"))
        kept = [c for c in configs if _fits(c.kwargs["BLOCK_M"], block_n, c.num_warps, tile)]
        return kept or [triton.Config({"BLOCK_M": 1}, num_warps=4)]

    return prune


def heuristic(n: int, elem_size: int, backward: bool) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) by width alone (never by row count: compiled graphs see it symbolic)."""
    block_n = _block_n(n, elem_size)
    if INTERPRETING:  # time is per program and per op: take big tiles
        return max(1, min(128, 65536 // block_n)), block_n, 4
    tile = (BWD_TILE if backward else FWD_TILE)[1] // 2
    block_m = max(1, min(32, tile // block_n))
    return block_m, block_n, min(max(block_m * block_n // 512, 4), 16)


_KEY = ["N", "IS_RMS", "HAS_BIAS"]  # the width, and the variant (its loads and flops differ)
_add_norm_fwd_tuned = triton.autotune(
    CONFIGS, key=_KEY + ["HAS_D", "STORE_S"], prune_configs_by={"early_config_prune": _prune(FWD_TILE)}
)(_add_norm_fwd)
_add_norm_bwd_tuned = triton.autotune(
    CONFIGS, key=_KEY + ["HAS_DS"], prune_configs_by={"early_config_prune": _prune(BWD_TILE)}
)(_add_norm_bwd)


@functools.lru_cache(maxsize=256)
def _launch(n: int, elem_size: int, backward: bool, tuned: bool):
    """(kernel, BLOCK_N, BLOCK_M or None when autotuned, launch keywords): cached, called on every launch."""
    block_m, block_n, num_warps = heuristic(n, elem_size, backward)
    if tuned:
        return (_add_norm_bwd_tuned if backward else _add_norm_fwd_tuned), block_n, None, {}
    return (
        (_add_norm_bwd if backward else _add_norm_fwd),
        block_n,
        block_m,
        {"BLOCK_M": block_m, "num_warps": num_warps},
    )


def _autotuning(device: torch.device) -> bool:
    return device.type == "cuda" and not INTERPRETING and not torch.are_deterministic_algorithms_enabled()


# autotune's pick per (kernel, width, variant, dtypes), for eager calls: (its meta-parameters, for the grid, and
# every launch keyword, BLOCK_M, num_warps, num_stages and the rest), built once when it is picked
_PICKED: dict[tuple, tuple[dict, dict]] = {}


def _run(kernel, wrap, grid, key: tuple | None, *args, **kwargs) -> None:
    """``wrap(kernel)[grid](*args, **kwargs)``; an eager launch of an autotuned kernel (``key`` given) that has
    picked its config for ``key`` launches the plain kernel directly with it: the Autotuner's per-call key
    building and argument merging cost host time on every call. Compiled graphs get the Autotuner itself
    (Inductor tunes), and the heuristic path its fixed config: both pass no key."""
    if key is None:
        wrap(kernel)[grid](*args, **kwargs)
    elif (picked := _PICKED.get(key)) is not None:
        meta, launch = picked
        kernel.fn[grid(meta) if callable(grid) else grid](*args, **kwargs, **launch)
    else:
        kernel[grid](*args, **kwargs)
        _PICKED[key] = (kernel.best_config.kwargs, kernel.best_config.all_kwargs())


def _eager_tuned(kernel, wrap) -> bool:
    """Whether a launch takes ``_run``'s direct path, so that its key is built only then."""
    return wrap is _identity and isinstance(kernel, Autotuner)


# ---------------------------------------------------------------------- launchers


def add_norm_forward(x, d, weight, bias, eps: float, is_rms: bool, residual_dtype=None, wrap=_identity):
    """Returns y and s (shaped like x, contiguous), mean (M,) or None for RMSNorm, and rstd (M,).

    ``wrap`` is ``torch.library.wrap_triton`` inside the custom operators (so compiled graphs hold the launch
    itself), and nothing in the eager fast path (which calls the kernel directly)."""
    n = int(x.shape[-1])  # the width sets BLOCK_N, a compile-time constant: compiled graphs specialize on it
    if d is not None and d.shape != x.shape:
        raise ValueError(f"x {tuple(x.shape)} and d {tuple(d.shape)} must have the same shape")
    x = x.contiguous()  # the kernels take no strides (fewer launch arguments): rows lie N elements apart
    m = x.numel() // n  # rows, (...) flattened
    has_d = d is not None
    if not has_d:
        d, s_dtype = x, residual_dtype or x.dtype
    else:
        d = d.contiguous()
        s_dtype = residual_dtype or (x.dtype if d.dtype == x.dtype else torch.promote_types(x.dtype, d.dtype))
    y = torch.empty_like(x, dtype=s_dtype)  # x is contiguous, so y is
    store_s = has_d or s_dtype != x.dtype
    s = torch.empty_like(x, dtype=s_dtype) if store_s else x
    rstd = x.new_empty(m, dtype=torch.float32)
    mean = None if is_rms else x.new_empty(m, dtype=torch.float32)  # RMSNorm has none: nothing allocated
    kernel, block_n, block_m, meta = _launch(n, max(x.element_size(), s.element_size()), False, _autotuning(x.device))
    if m > 0:
        grid = (triton.cdiv(m, block_m),) if block_m else lambda meta: (triton.cdiv(m, meta["BLOCK_M"]),)
        key = (
            (False, n, is_rms, has_d, bias is not None, store_s, x.dtype, d.dtype, s.dtype, weight.dtype)
            if _eager_tuned(kernel, wrap)
            else None
        )
        _run(
            kernel,
            wrap,
            grid,
            key,
            x,
            d,
            s,
            y,
            weight,
            weight if bias is None else bias,
            rstd if mean is None else mean,
            rstd,
            m,
            n,
            eps,
            BLOCK_N=block_n,
            IS_RMS=is_rms,
            HAS_D=has_d,
            HAS_BIAS=bias is not None,
            STORE_S=store_s,
            **meta,
        )
    return y, s, mean, rstd


def programs(device: torch.device) -> int:
    """Backward programs: a persistent grid, two per multiprocessor, whatever the row count (so the dW / dB
    partial buffer and the summation order depend on the device only)."""
    if INTERPRETING or device.type != "cuda":
        return 4
    return 2 * _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def add_norm_backward(dy, ds, s, weight, bias, mean, rstd, is_rms: bool, x_dtype, wrap=_identity):
    """Returns dx (shaped like s) in ``x_dtype``, dW (N,) and dB (N,) or None, in the parameters' dtypes."""
    n = int(s.shape[-1])  # rows may be symbolic in a compiled graph; the width may not
    s, dy = s.contiguous(), dy.contiguous()
    has_ds = ds is not None
    ds = ds.contiguous() if has_ds else dy
    m = s.numel() // n
    dx = torch.empty_like(s, dtype=x_dtype)
    kernel, block_n, block_m, meta = _launch(n, s.element_size(), True, _autotuning(s.device))
    p = programs(s.device)
    dw_part = s.new_empty(p, n, dtype=torch.float32)  # every program writes its row, even with no tile
    db_part = dw_part if bias is None else s.new_empty(p, n, dtype=torch.float32)
    key = (
        (True, n, is_rms, has_ds, bias is not None, dy.dtype, ds.dtype, s.dtype, weight.dtype, x_dtype)
        if _eager_tuned(kernel, wrap)
        else None
    )
    _run(
        kernel,
        wrap,
        (p,),
        key,
        dy,
        ds,
        s,
        weight,
        rstd if mean is None else mean,
        rstd,
        dx,
        dw_part,
        db_part,
        m,
        n,
        BLOCK_N=block_n,
        IS_RMS=is_rms,
        HAS_DS=has_ds,
        HAS_BIAS=bias is not None,
        **meta,
    )
    dw = dw_part.sum(0)  # (N,) fp32: a fixed-order sum over programs (deterministic)
    dw = dw if dw.dtype == weight.dtype else dw.to(weight.dtype)
    if bias is None:
        return dx, dw, None
    db = db_part.sum(0)
    return dx, dw, db if db.dtype == bias.dtype else db.to(bias.dtype)

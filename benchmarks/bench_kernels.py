"""Benchmark of the fused Triton Add & Norm kernels against torch eager and torch.compile.

    make bench-kernels                     # on a CUDA GPU: the full table, and benchmarks/results/kernels.csv
    TRITON_INTERPRET=1 make bench-kernels  # no GPU: one small shape through the interpreter (a smoke check)
    python benchmarks/bench_kernels.py --python-overhead   # no GPU: host time of the Python, launches stubbed

For each (norm, with/without residual, dtype, hidden size) with rows = the tokens of
a realistic batch, it times forward and forward+backward two ways, kept apart:
- GPU time: the call replayed from a CUDA graph (triton.testing.do_bench_cudagraph), so no host
  time is in it; the profiler's kernel times where a graph cannot be captured. Bandwidth (bytes
  that must be read and written / GPU time) and its fraction of a measured device-to-device copy
  come from it.
- wall time: triton.testing.do_bench of the plain eager call, what a caller sees; where it is well
  above the GPU time, the host (Python, launches) sets the pace.
Host time per call is measured on its own on a tiny input, where the GPU does almost nothing, after the table.
The figures are printed, never asserted.

Each case starts from scratch, so that no case times what an earlier one left behind:
- autotune's picks are forgotten (``reset_autotune``): its key is the width and the variant, not the row count,
  so a pick made on another case's rows (the host-time section's 8 rows, say) would be reused as it is;
- torch.compile's caches are reset (``torch._dynamo.reset()``) and the function compiled with ``dynamic=False``:
  Dynamo's cache belongs to the function's code, so without the reset a second width would recompile it with
  dynamic shapes (automatic dynamic) and the compile column would time a dynamic-shape kernel, and past the
  recompile limit (8) it would time eager torch instead. The reset is what prevents both; ``dynamic=False``
  says the intent (one static-shape kernel per case).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def torch_add_norm(x, d, weight, bias, eps, is_rms):
    """The unfused reference: an add, then the norm (two kernels, or one more without d)."""
    s = x + d if d is not None else x
    y = F.rms_norm(s, (s.shape[-1],), weight, eps) if is_rms else F.layer_norm(s, (s.shape[-1],), weight, bias, eps)
    return s, y  # as the fused op: the sum, then its norm


def traffic_bytes(rows: int, n: int, elem: int, with_d: bool, is_rms: bool, backward: bool) -> int:
    """Bytes that must move: forward reads x (and d), writes y (and s); backward reads dy (and ds), s, writes dx."""
    tensor = rows * n * elem
    fwd = tensor * (2 + (2 if with_d else 0))
    stats = rows * 4 * (1 if is_rms else 2)  # rstd (and mean), fp32
    if not backward:
        return fwd + stats
    bwd = tensor * (3 + (1 if with_d else 0)) + stats  # dy, s, dx (+ ds)
    return fwd + stats + bwd


def copy_bandwidth(device) -> float:
    """GB/s of a device-to-device copy of 1 GiB: the practical ceiling."""
    from triton.testing import do_bench

    src = torch.empty(2**28, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def gpu_time_ms(fn, grad_to_none=None) -> tuple[float, str]:
    """Milliseconds of GPU time per call, without host time: replayed from a CUDA graph, or, where capture
    fails, the profiler's sum of kernel times per call. Returns (ms, method)."""
    from triton.testing import do_bench_cudagraph

    try:
        return do_bench_cudagraph(fn, grad_to_none=grad_to_none), "cudagraph"
    except RuntimeError:  # something in fn cannot be captured: time its kernels instead
        torch.cuda.synchronize()
        return profiler_kernel_ms(fn, grad_to_none), "profiler"


def profiler_kernel_ms(fn, grad_to_none=None, calls: int = 20) -> float:
    """Sum of the CUDA kernels' own times per call (gaps between kernels excluded), from torch.profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            for t in grad_to_none or ():
                t.grad = None
            fn()
        torch.cuda.synchronize()
    kernel_us = sum(e.device_time for e in prof.events() if e.device_type == DeviceType.CUDA)
    return kernel_us / calls / 1e3


def reset_autotune() -> None:
    """Forget autotune's picks: the next launch of each width and variant tunes again, on its own rows."""
    import resnorm_lm.model.kernels.add_norm as kernels

    for tuned in (kernels._add_norm_fwd_tuned, kernels._add_norm_bwd_tuned):
        tuned.cache.clear()
    kernels._PICKED.clear()  # the eager path's copy of the picks


def bench_case(norm, with_d, dtype, n, rows, device, copy_gbs):
    import torch._dynamo
    from triton.testing import do_bench

    from resnorm_lm.model.kernels.add_norm_ops import add_norm
    from resnorm_lm.model.kernels.add_norm_ops import norm as fused_norm

    reset_autotune()
    torch._dynamo.reset()  # a static-shape compile of this case alone (the module docstring says why)

    is_rms = norm == "rmsnorm"
    x = torch.randn(rows, n, dtype=dtype, device=device, requires_grad=True)
    d = torch.randn(rows, n, dtype=dtype, device=device, requires_grad=True) if with_d else None
    w = torch.ones(n, dtype=dtype, device=device, requires_grad=True)
    b = None if is_rms else torch.zeros(n, dtype=dtype, device=device, requires_grad=True)
    eps = 1e-5

    def fused():
        return add_norm(x, d, w, b, eps, is_rms) if with_d else (x, fused_norm(x, w, b, eps, is_rms))

    compiled = torch.compile(torch_add_norm, dynamic=False)
    impls = {
        "triton": fused,
        "torch": lambda: torch_add_norm(x, d, w, b, eps, is_rms),
        "compile": lambda: compiled(x, d, w, b, eps, is_rms),
    }
    dy = torch.randn(rows, n, dtype=dtype, device=device)
    leaves = [t for t in (x, d, w, b) if t is not None]
    rows_out = []
    for impl, fn in impls.items():

        def fwd_bwd(fn=fn):
            s, y = fn()
            torch.autograd.backward([y, s] if with_d else [y], [dy, dy] if with_d else [dy])

        fwd_gpu, method = gpu_time_ms(fn)
        both_gpu, method_bwd = gpu_time_ms(fwd_bwd, grad_to_none=leaves)
        fwd_wall, both_wall = do_bench(fn), do_bench(fwd_bwd, grad_to_none=leaves)
        phases = (
            ("fwd", fwd_gpu, fwd_wall),
            ("fwd+bwd", both_gpu, both_wall),
            ("bwd", both_gpu - fwd_gpu, both_wall - fwd_wall),
        )
        for phase, gpu_ms, wall_ms in phases:
            nbytes = traffic_bytes(rows, n, x.element_size(), with_d, is_rms, phase != "fwd")
            if phase == "bwd":  # the backward's own bytes: all minus the forward's
                nbytes -= traffic_bytes(rows, n, x.element_size(), with_d, is_rms, False)
            gbs = nbytes / (gpu_ms * 1e-3) / 1e9
            rows_out.append(
                dict(
                    norm=norm,
                    residual=with_d,
                    dtype=str(dtype).replace("torch.", ""),
                    hidden=n,
                    rows=rows,
                    impl=impl,
                    phase=phase,
                    gpu_us=round(gpu_ms * 1e3, 1),
                    wall_us=round(wall_ms * 1e3, 1),
                    gb_s=round(gbs, 1),
                    of_copy=round(gbs / copy_gbs, 3),
                    gpu_timing=method if phase == "fwd" else method_bwd,
                )
            )
    return rows_out


def us_per_call(fn, dy, backward: bool, calls: int, sync=lambda: None) -> float:
    """Host microseconds per call of ``fn`` (then backward, if asked): ``calls`` back-to-back calls after a
    warm-up, one ``sync`` at each end, divided by ``calls``."""
    import time

    def call():
        s, y = fn()
        if backward:
            torch.autograd.backward([y, s], [dy, dy])

    for _ in range(20):
        call()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def host_overhead_us(device, n: int = 768, rows: int = 8, calls: int = 300) -> list[dict]:
    """Host (CPU) microseconds per call on a tiny input, where GPU time is negligible: the launch cost, in
    eager (the fast path, the operators) and inside compiled graphs (Inductor launching the kernels)."""
    import torch._dynamo

    from resnorm_lm.model.kernels.add_norm_ops import add_norm, add_norm_fwd

    reset_autotune()  # tuned on these rows, apart from the table's
    torch._dynamo.reset()
    x = torch.randn(rows, n, dtype=torch.bfloat16, device=device, requires_grad=True)
    d = torch.randn_like(x, requires_grad=True)
    w = torch.ones(n, dtype=torch.bfloat16, device=device, requires_grad=True)
    b = torch.zeros(n, dtype=torch.bfloat16, device=device, requires_grad=True)
    dy = torch.randn_like(x)
    compiled_triton = torch.compile(lambda: add_norm(x, d, w, b, 1e-5, False))
    compiled_torch = torch.compile(lambda: torch_add_norm(x, d, w, b, 1e-5, False))
    impls = {
        "triton (eager fast path)": lambda: add_norm(x, d, w, b, 1e-5, False),
        "triton (custom operator)": lambda: add_norm_fwd(x, d, w, b, 1e-5, False, None)[:2],
        "torch eager": lambda: torch_add_norm(x, d, w, b, 1e-5, False),
        "triton, compiled": compiled_triton,
        "torch, compiled": compiled_torch,
    }
    return [
        {
            "impl": impl,
            "phase": phase,
            "us_per_call": round(us_per_call(fn, dy, phase == "fwd+bwd", calls, torch.cuda.synchronize), 1),
        }
        for impl, fn in impls.items()
        for phase in ("fwd", "fwd+bwd")
    ]


def python_overhead_without_gpu(calls: int = 2000, repeats: int = 5) -> int:
    """Host microseconds per call of the Python around the kernels, with the Triton launches stubbed out
    (what a CPU can say about launch cost): the eager fast path, the custom operators, and torch eager.
    ``repeats`` rounds, the paths interleaved in each; min and median over rounds (a shared CPU is noisy)."""
    import statistics

    import resnorm_lm.model.kernels.add_norm as kernels
    from resnorm_lm.model.kernels import add_norm_ops as ops

    for kernel in (kernels._add_norm_fwd, kernels._add_norm_bwd):  # kernel[grid](...) ends in kernel.run(...)
        kernel.run = lambda *args, **kwargs: None
    x, d = (torch.randn(8, 768, requires_grad=True) for _ in range(2))
    w, b, dy = torch.ones(768, requires_grad=True), torch.zeros(768, requires_grad=True), torch.randn(8, 768)

    def fused_op():
        y, s, _, _ = ops.add_norm_fwd(x, d, w, b, 1e-5, False, None)
        return s, y

    paths = {
        "fast path": lambda: ops.add_norm(x, d, w, b, 1e-5, False),
        "custom op": fused_op,
        "torch eager (real compute)": lambda: torch_add_norm(x, d, w, b, 1e-5, False),
    }
    cases = [(name, phase) for name in paths for phase in ("fwd", "fwd+bwd")]
    times: dict[tuple, list[float]] = {case: [] for case in cases}
    for _ in range(repeats):
        for name, phase in cases:
            times[(name, phase)].append(us_per_call(paths[name], dy, phase == "fwd+bwd", calls))
    print(
        f"Python host time per call, 8 x 768 fp32, Triton launches stubbed out, {calls} calls x {repeats} rounds "
        f"({platform.processor() or platform.machine()}, torch {torch.__version__}), us min / median:"
    )
    for (name, phase), us in times.items():
        print(f"  {name:28} {phase:8} {min(us):7.1f} {statistics.median(us):7.1f}")
    return 0


def interpreter_smoke() -> int:
    from resnorm_lm.model.kernels.add_norm_ops import add_norm

    x, d = torch.randn(256, 768), torch.randn(256, 768)
    w, b = torch.randn(768), torch.randn(768)
    s, y = add_norm(x, d, w, b, 1e-5, False)
    _, ref = torch_add_norm(x, d, w, b, 1e-5, False)
    err = (y - ref).abs().max().item()
    print(
        f"TRITON_INTERPRET=1: one shape (256 x 768, layernorm + residual) through the interpreter: max |diff| "
        f"vs torch = {err:.2e}. Interpreter timings say nothing about GPU speed; no table."
    )
    return 0 if err < 1e-4 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16 * 1024, help="tokens per call (default: 16 x 1024)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[768, 1024, 2048, 4096, 8192])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16", "float32"])
    parser.add_argument("--norms", nargs="+", choices=["layernorm", "rmsnorm"], default=["layernorm", "rmsnorm"])
    parser.add_argument(
        "--residual",
        nargs="+",
        choices=["yes", "no"],
        default=["yes", "no"],
        help="with the residual add (Add & Norm), without (the norm alone), or both",
    )
    parser.add_argument("--skip-host-time", action="store_true", help="leave out the host time per call")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall time to keep to: no case is started that would not finish by then",
    )
    parser.add_argument("--csv", default=str(ROOT / "benchmarks" / "results" / "kernels.csv"))
    parser.add_argument(
        "--python-overhead",
        action="store_true",
        help="no GPU needed: host time of the Python around the kernels, launches stubbed out",
    )
    parser.add_argument("--repeats", type=int, default=5, help="rounds of --python-overhead (default: 5)")
    args = parser.parse_args()
    if args.python_overhead:
        return python_overhead_without_gpu(repeats=args.repeats)
    if not torch.cuda.is_available():
        if os.environ.get("TRITON_INTERPRET") == "1":
            return interpreter_smoke()
        print(
            "bench-kernels: skipped: no CUDA GPU on this machine, nothing to measure. "
            "Run it on a GPU, or with TRITON_INTERPRET=1 for a smoke check."
        )
        return 0
    return table(args)


def table(args) -> int:
    """The table on the GPU, each case printed and saved as it finishes, then the host time per call."""
    import time

    started = time.monotonic()
    device = torch.device("cuda")
    copy_gbs = copy_bandwidth(device)
    import triton

    print(
        f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
        f"python {platform.python_version()}"
    )
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s (the ceiling for of_copy)")
    impls = ("triton", "torch", "compile")
    print(
        f"\n{args.rows} rows. GPU time in us (CUDA-graph replay, no host time) and its fraction of copy bandwidth; "
        "then the eager wall time of one call (do_bench), where host time shows:"
    )
    print(
        f"{'norm':9} {'res':3} {'dtype':8} {'hidden':>6} {'phase':7} "
        + " ".join(f"{impl + ' us':>11} {'(copy)':>6}" for impl in impls)
        + " "
        + " ".join(f"{impl + ' wall':>12}" for impl in impls),
        flush=True,
    )
    Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
    # Add & Norm first (the fused kernel's purpose), width by width, both norms at each: a table cut short by
    # its budget still has every norm at the widths it reached
    cases = [
        (dtype, norm, residual == "yes", n)
        for dtype in args.dtypes
        for residual in args.residual
        for n in args.hidden
        for norm in args.norms
    ]
    results, slowest = [], 0.0
    with open(args.csv, "w", newline="") as f:  # written as the cases finish: a run cut short keeps what it has
        writer = None
        for index, (dtype, norm, with_d, n) in enumerate(cases):
            if args.budget_s and time.monotonic() - started + max(slowest, 30.0) > args.budget_s:
                left = ", ".join(f"{c[1]} {'yes' if c[2] else 'no'} {c[0]} {c[3]}" for c in cases[index:])
                print(f"stopped by the time budget ({args.budget_s:.0f} s) before: {left}", flush=True)
                break
            t0 = time.monotonic()
            try:
                case = bench_case(norm, with_d, getattr(torch, dtype), n, args.rows, device, copy_gbs)
            except Exception as err:  # one case failing (a compile, a launch) leaves the others' rows
                print(
                    f"{norm:9} {'yes' if with_d else 'no':3} {dtype:8} {n:6d} failed: {type(err).__name__}: "
                    f"{str(err)[:300]}",
                    flush=True,
                )
                continue
            slowest = max(slowest, time.monotonic() - t0)
            writer = writer or csv.DictWriter(f, fieldnames=list(case[0]))
            if not results:
                writer.writeheader()
            writer.writerows(case)
            f.flush()
            results += case
            keyed = {(r["phase"], r["impl"]): r for r in case}
            for phase in ("fwd", "bwd", "fwd+bwd"):
                cells = " ".join(f"{keyed[phase, i]['gpu_us']:11.1f} {keyed[phase, i]['of_copy']:6.2f}" for i in impls)
                walls = " ".join(f"{keyed[phase, i]['wall_us']:12.1f}" for i in impls)
                print(
                    f"{norm:9} {'yes' if with_d else 'no':3} {case[0]['dtype']:8} {n:6d} {phase:7} {cells} {walls}",
                    flush=True,
                )
    if not args.skip_host_time and not (args.budget_s and time.monotonic() - started + 60 > args.budget_s):
        overhead = host_overhead_us(device)
        print("\nhost time per call, layernorm + residual, 8 x 768 bf16 (launch-bound), microseconds:")
        for impl in dict.fromkeys(r["impl"] for r in overhead):
            fwd, both = (
                next(r["us_per_call"] for r in overhead if (r["impl"], r["phase"]) == (impl, p))
                for p in ("fwd", "fwd+bwd")
            )
            print(f"  {impl:26} fwd {fwd:7.1f}   fwd+bwd {both:7.1f}")
    elif not args.skip_host_time:
        print("host time per call: left out by the time budget")
    if any(r["gpu_timing"] != "cudagraph" for r in results):
        print(
            "(some GPU times are the profiler's kernel sums: their CUDA graph could not be captured; gpu_timing "
            "in the CSV says which)"
        )
    print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

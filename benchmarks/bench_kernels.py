"""Benchmark of the fused Triton Add & Norm kernels against torch eager and torch.compile.

    make bench-kernels                     # on a CUDA GPU: the full table, and benchmarks/results/kernels.csv
    TRITON_INTERPRET=1 make bench-kernels  # no GPU: one small shape through the interpreter (a smoke check)

For each (norm, with/without residual, dtype, hidden size) with rows = the tokens of
a realistic batch, it times forward and forward+backward, prints the effective
bandwidth (bytes that must be read and written / time) and its fraction of a
measured device-to-device copy on the same GPU. Timings are medians of
triton.testing.do_bench; the figures are printed, never asserted.
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
    return y, s


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


def bench_case(norm, with_d, dtype, n, rows, device, copy_gbs):
    from triton.testing import do_bench

    from resnorm_lm.kernels.add_norm_ops import add_norm
    from resnorm_lm.kernels.add_norm_ops import norm as fused_norm

    is_rms = norm == "rmsnorm"
    x = torch.randn(rows, n, dtype=dtype, device=device, requires_grad=True)
    d = torch.randn(rows, n, dtype=dtype, device=device, requires_grad=True) if with_d else None
    w = torch.ones(n, dtype=dtype, device=device, requires_grad=True)
    b = None if is_rms else torch.zeros(n, dtype=dtype, device=device, requires_grad=True)
    eps = 1e-5

    def fused():
        return add_norm(x, d, w, b, eps, is_rms) if with_d else (fused_norm(x, w, b, eps, is_rms), x)

    compiled = torch.compile(torch_add_norm)
    impls = {
        "triton": fused,
        "torch": lambda: torch_add_norm(x, d, w, b, eps, is_rms),
        "compile": lambda: compiled(x, d, w, b, eps, is_rms),
    }
    dy = torch.randn(rows, n, dtype=dtype, device=device)
    rows_out = []
    for impl, fn in impls.items():
        fwd_ms = do_bench(lambda fn=fn: fn())

        def fwd_bwd(fn=fn):
            y, s = fn()
            torch.autograd.backward([y, s] if with_d else [y], [dy, dy] if with_d else [dy])

        both_ms = do_bench(fwd_bwd, grad_to_none=[t for t in (x, d, w, b) if t is not None])
        for phase, ms in (("fwd", fwd_ms), ("fwd+bwd", both_ms), ("bwd", both_ms - fwd_ms)):
            nbytes = traffic_bytes(rows, n, x.element_size(), with_d, is_rms, phase != "fwd")
            if phase == "bwd":  # the backward's own bytes: all minus the forward's
                nbytes -= traffic_bytes(rows, n, x.element_size(), with_d, is_rms, False)
            gbs = nbytes / (ms * 1e-3) / 1e9
            rows_out.append(dict(norm=norm, residual=with_d, dtype=str(dtype).replace("torch.", ""), hidden=n,
                                 rows=rows, impl=impl, phase=phase, ms=round(ms, 4), gb_s=round(gbs, 1),
                                 of_copy=round(gbs / copy_gbs, 3)))  # fmt: skip
    return rows_out


def us_per_call(fn, dy, backward: bool, calls: int, sync=lambda: None) -> float:
    """Host microseconds per call of ``fn`` (then backward, if asked): ``calls`` back-to-back calls after a
    warm-up, one ``sync`` at each end, divided by ``calls``."""
    import time

    def call():
        y, s = fn()
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
    """Host (CPU) microseconds per call on a tiny input, where GPU time is negligible: the launch cost."""
    from resnorm_lm.kernels.add_norm_ops import add_norm

    x = torch.randn(rows, n, dtype=torch.bfloat16, device=device, requires_grad=True)
    d = torch.randn_like(x, requires_grad=True)
    w = torch.ones(n, dtype=torch.bfloat16, device=device, requires_grad=True)
    b = torch.zeros(n, dtype=torch.bfloat16, device=device, requires_grad=True)
    dy = torch.randn_like(x)
    impls = {
        "triton": lambda: add_norm(x, d, w, b, 1e-5, False),
        "torch": lambda: torch_add_norm(x, d, w, b, 1e-5, False),
    }
    return [{"impl": impl, "phase": phase,
             "us_per_call": round(us_per_call(fn, dy, phase == "fwd+bwd", calls, torch.cuda.synchronize), 1)}
            for impl, fn in impls.items() for phase in ("fwd", "fwd+bwd")]  # fmt: skip


def python_overhead_without_gpu(calls: int = 2000) -> int:
    """Host microseconds per call of the Python around the kernels, with the Triton launches stubbed out
    (what a CPU can say about launch cost): the eager fast path, the custom operators, and torch eager."""
    import resnorm_lm.kernels.add_norm as kernels
    from resnorm_lm.kernels import add_norm_ops as ops

    class NoLaunch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    kernels._add_norm_fwd = kernels._add_norm_bwd = NoLaunch()
    x, d = (torch.randn(8, 768, requires_grad=True) for _ in range(2))
    w, b, dy = torch.ones(768, requires_grad=True), torch.zeros(768, requires_grad=True), torch.randn(8, 768)

    def fused_op():
        y, s, _, _ = ops.add_norm_fwd(x, d, w, b, 1e-5, False, None)
        return y, s

    paths = {"fast path": lambda: ops.add_norm(x, d, w, b, 1e-5, False), "custom op": fused_op,
             "torch eager (real compute)": lambda: torch_add_norm(x, d, w, b, 1e-5, False)}  # fmt: skip
    print(f"Python host time per call, 8 x 768 fp32, Triton launches stubbed out, {calls} calls "
          f"({platform.processor() or platform.machine()}, torch {torch.__version__}):")  # fmt: skip
    for name, fn in paths.items():
        for phase in ("fwd", "fwd+bwd"):
            print(f"  {name:28} {phase:8} {us_per_call(fn, dy, phase == 'fwd+bwd', calls):7.1f} us")
    return 0


def interpreter_smoke() -> int:
    from resnorm_lm.kernels.add_norm_ops import add_norm

    x, d = torch.randn(256, 768), torch.randn(256, 768)
    w, b = torch.randn(768), torch.randn(768)
    y, s = add_norm(x, d, w, b, 1e-5, False)
    ref, _ = torch_add_norm(x, d, w, b, 1e-5, False)
    err = (y - ref).abs().max().item()
    print(f"TRITON_INTERPRET=1: one shape (256 x 768, layernorm + residual) through the interpreter: max |diff| "
          f"vs torch = {err:.2e}. Interpreter timings say nothing about GPU speed; no table.")  # fmt: skip
    return 0 if err < 1e-4 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16 * 1024, help="tokens per call (default: 16 x 1024)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[768, 1024, 2048, 4096, 8192])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16", "float32"])
    parser.add_argument("--csv", default=str(ROOT / "benchmarks" / "results" / "kernels.csv"))
    parser.add_argument("--python-overhead", action="store_true",
                        help="no GPU needed: host time of the Python around the kernels, "
                        "launches stubbed out")  # fmt: skip
    args = parser.parse_args()
    if args.python_overhead:
        return python_overhead_without_gpu()
    if not torch.cuda.is_available():
        if os.environ.get("TRITON_INTERPRET") == "1":
            return interpreter_smoke()
        print("bench-kernels: no CUDA GPU on this machine, nothing to measure (skipped). "
              "Run it on a GPU, or with TRITON_INTERPRET=1 for a smoke check.")  # fmt: skip
        return 0
    device = torch.device("cuda")
    copy_gbs = copy_bandwidth(device)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  python {platform.python_version()}")
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s (the ceiling for of_copy)")
    overhead = host_overhead_us(device)
    print("host time per call, layernorm + residual, 8 x 768 bf16 (launch-bound), microseconds: "
          + ", ".join(f"{r['impl']} {r['phase']} {r['us_per_call']:.0f}" for r in overhead))  # fmt: skip
    results = []
    for dtype in (getattr(torch, name) for name in args.dtypes):
        for norm in ("layernorm", "rmsnorm"):
            for with_d in (True, False):
                for n in args.hidden:
                    results += bench_case(norm, with_d, dtype, n, args.rows, device, copy_gbs)
    header = f"{'norm':9} {'res':3} {'dtype':8} {'hidden':>6} {'phase':7} " + " ".join(
        f"{impl + ' GB/s':>13} {'(copy)':>6}" for impl in ("triton", "torch", "compile")
    )
    print(header)
    keyed = {(r["norm"], r["residual"], r["dtype"], r["hidden"], r["phase"], r["impl"]): r for r in results}
    for key in sorted({k[:5] for k in keyed}, key=lambda k: (k[2], k[0], not k[1], k[3], k[4])):
        cells = " ".join(f"{keyed[key + (i,)]['gb_s']:13.0f} {keyed[key + (i,)]['of_copy']:6.2f}" for i in
                         ("triton", "torch", "compile"))  # fmt: skip
        print(f"{key[0]:9} {'yes' if key[1] else 'no':3} {key[2]:8} {key[3]:6d} {key[4]:7} {cells}")
    Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

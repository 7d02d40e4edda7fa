"""Profile one training step of the gpu profile's GPT-2 small: where the GPU time goes.

    python benchmarks/profile_step.py --backend triton --out /tmp/profile      # on a CUDA GPU
    python benchmarks/profile_step.py --smoke --out /tmp/profile               # a tiny model on CPU (a check)

The step is what `fit` runs on one GPU: bf16 autocast, forward, backward, fused AdamW, on random
tokens, compiled unless --no-compile. After warm-up steps (compilation, autotuning), a few steps run
under torch.profiler. It prints the kernels by GPU time and their share by kind (matmul, attention,
the Add & Norm kernels, other Triton kernels, the optimizer, copies, the rest), and writes:
    <out>/kernels.txt   the profiler's table, sorted by GPU time
    <out>/summary.json  the shares by kind, step time, MFU
    <out>/trace.json.gz the Chrome trace (open in https://ui.perfetto.dev)
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# kernel-name patterns per kind, first match wins (cuBLAS / CUTLASS / nvjet GEMMs, flash / cuDNN / efficient
# attention, our kernels, Inductor's generated Triton kernels, the fused optimizer)
KINDS = [
    ("add & norm (ours)", ("_add_norm_fwd", "_add_norm_bwd")),
    ("attention", ("flash", "fmha", "attention", "cudnn", "sdpa")),
    ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "sm90_", "sm80_", "cublas", "matmul")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("other triton (inductor)", ("triton_",)),
    ("copies and fills", ("memcpy", "memset", "copy", "fill")),
]


def kind_of(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, keys in KINDS if any(k in lowered for k in keys)), "other")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["torch", "triton"], default="triton", help="norm backend")
    parser.add_argument("--placement", default="prenorm")
    parser.add_argument("--batch", type=int, default=32, help="sequences per step (gpu profile: 32)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="eager instead of compiled")
    parser.add_argument("--warmup", type=int, default=5, help="steps before profiling (compilation, autotuning)")
    parser.add_argument("--steps", type=int, default=3, help="steps profiled")
    parser.add_argument("--smoke", action="store_true", help="a tiny model on CPU: checks this script runs")
    parser.add_argument("--out", required=True, help="directory for kernels.txt, summary.json, trace.json.gz")
    args = parser.parse_args()

    from torch.profiler import ProfilerActivity, profile

    from benchmarks.bench_training import no_peak_reason, peak_flops
    from resnorm_lm.model import GPT, GPTConfig

    if not args.smoke and not torch.cuda.is_available():
        print("profile_step: needs a CUDA GPU (or --smoke for a CPU check)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke:  # the torch backend: the fused kernels need a GPU or the interpreter
        shape = dict(vocab_size=512, block_size=64, n_layer=2, n_head=2, n_embd=64)
        args.backend, args.batch = "torch", 4
    else:
        shape = dict(vocab_size=32768, block_size=1024, n_layer=12, n_head=12, n_embd=768)
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    cfg = GPTConfig(**shape, placement=args.placement, norm_backend=args.backend)
    model = GPT(cfg).to(device)
    if args.compile:
        model.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    x, y = (torch.randint(0, cfg.vocab_size, (args.batch, cfg.block_size), device=device) for _ in range(2))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    step_s = (time.perf_counter() - t0) / args.steps  # unprofiled, for MFU

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        sync()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=40)
    (out / "kernels.txt").write_text(table)
    trace = out / "trace.json"
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as src, gzip.open(out / "trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()

    # GPU time by kind: device-side events (kernels, copies), per step
    from torch.autograd import DeviceType

    device_events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    shares: dict[str, float] = {}
    for e in device_events:
        shares[kind_of(e.name)] = shares.get(kind_of(e.name), 0.0) + e.device_time / 1e3 / args.steps  # ms
    gpu_ms = sum(shares.values())
    tokens = args.batch * cfg.block_size
    per_token = model.flops_per_token()
    peak = peak_flops() if device.type == "cuda" else None
    summary = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "backend": args.backend,
        "placement": args.placement,
        "compile": args.compile,
        "batch": args.batch,
        "step_s": round(step_s, 5),
        "tokens_per_s": round(tokens / step_s),
        "mfu": round(tokens / step_s * per_token / peak, 3) if peak else None,
        "gpu_ms_per_step": round(gpu_ms, 3),
        "gpu_ms_by_kind": {k: round(v, 3) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(table)
    mfu = summary["mfu"] if summary["mfu"] is not None else f"left out ({no_peak_reason()})"
    print(
        f"step {step_s * 1e3:.1f} ms, {summary['tokens_per_s']} tokens/s, MFU {mfu}; GPU busy {gpu_ms:.1f} ms per step:"
    )
    for kind, ms in summary["gpu_ms_by_kind"].items():
        print(f"  {kind:24} {ms:9.2f} ms  {ms / gpu_ms if gpu_ms else 0:6.1%}")
    print(f"wrote {out / 'kernels.txt'}, {out / 'summary.json'}, {out / 'trace.json.gz'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the cpu-profile training step's time goes, beside this machine's own matmul peak.

    python benchmarks/step_anatomy.py            # fp32 and bf16-mixed, eager and compiled (make bench runs it)
    python benchmarks/step_anatomy.py --quick    # fewer steps, eager only

The step is fit's on one CPU: prenorm-12l at the cpu profile's shape (12 x 128 wide, vocab 8192, batch 16 x
128), forward under the precision's autocast, backward, clip at 1.0, AdamW, on random tokens, with the CPU
attention kernel that ``resnorm_lm.train.cpu_attention`` chooses for the dtype. "plain" is the same step as
the project ran it until 2026-11-24: the LM head's (N, V) logits and ``F.cross_entropy``, SDPA's default
kernel, and AdamW's Python loop over tensors instead of its fused kernel.

Each configuration is timed unprofiled (median of steps after warm-up: its step time), then a few steps run
under ``torch.profiler``, and every operator's self CPU time goes to the first kind (in the order of KINDS)
named by the operator itself, else by an operator or autograd node around it (so matmuls are matmuls
wherever they run, and "cross-entropy" is the loss's work besides its matmuls, with either loss). The FLOPs
are the model's (6N + 12 L C T per token, ``GPT.flops_per_token``); the peak is a 2048^3 matmul of the same
dtype, measured in the same run at the same thread count. Nothing is asserted: the figures are this machine's.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPE = dict(vocab_size=8192, block_size=128, n_layer=12, n_head=4, n_embd=128)  # recipes/profiles/cpu.yaml
BATCH = 16
# (kind, name fragments): an operator's self time goes to the first kind whose fragment names it, else to the first
# whose fragment names an enclosing operator, record_function range or autograd node
KINDS = [
    ("optimizer and clip", ("optimizer.step", "clip_grad", "adamw")),
    (
        "cross-entropy",
        (
            "linear_cross_entropy",
            "linearcrossentropy",
            "log_softmax",
            "nll_loss",
            "cross_entropy",
            "logsoftmax",
            "nllloss",
        ),
    ),
    ("attention", ("scaled_dot_product", "flash_attention", "bmm", "softmax")),
    ("norms", ("layer_norm", "layernorm", "rms_norm", "add_norm")),
    ("casts", ("_to_copy", "tocopybackward", "aten::to")),
    ("matmuls", ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "mmbackward", "addmmbackward")),
]
OTHER = "other (GELU, adds, embedding, fills, ...)"


def kind_of(event) -> str:
    """The kind named by the operator itself, else by anything around it: a matmul or a cast is one wherever it
    runs (the loss's own matmuls count as matmuls, with either loss), the rest belongs to what encloses it."""
    names = []
    while event is not None:
        names.append(event.name.lower())
        event = event.cpu_parent
    for candidates in (names[:1], names):
        for kind, fragments in KINDS:
            if any(fragment in name for name in candidates for fragment in fragments):
                return kind
    return OTHER


def plain_cross_entropy(h, weight, targets, reduction="mean"):
    """The head and loss written plainly: the (N, V) logits, then ``F.cross_entropy``."""
    from resnorm_lm.targets import IGNORE_INDEX

    return F.cross_entropy(F.linear(h, weight).float(), targets, ignore_index=IGNORE_INDEX, reduction=reduction)


@contextlib.contextmanager
def plain_path():
    """The model's loss through the logits and SDPA's default CPU kernel, for the duration."""
    import resnorm_lm.model.gpt as gpt
    import resnorm_lm.model.layers as layers

    saved_loss, saved_backends = gpt.linear_cross_entropy, dict(layers.CPU_SDPA_BACKENDS)
    gpt.linear_cross_entropy = plain_cross_entropy
    layers.CPU_SDPA_BACKENDS.clear()
    try:
        yield
    finally:
        gpt.linear_cross_entropy = saved_loss
        layers.CPU_SDPA_BACKENDS.update(saved_backends)


def gemm_peak(dtype: torch.dtype, n: int = 2048, repeat: int = 5) -> float:
    """GFLOP/s of an n^3 matmul in ``dtype`` (best of ``repeat``): the machine's own ceiling for the step."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def measure(precision: str, compiled: bool, steps: int, profiled: int, plain: bool = False) -> dict:
    """Step time, compile time (first step minus a step) and self CPU ms per step by kind for one configuration."""
    from torch.profiler import ProfilerActivity, profile

    from resnorm_lm.model.gpt import GPT, GPTConfig
    from resnorm_lm.train.cpu_attention import use_for_run
    from resnorm_lm.train.optim import OptimConfig, build_optimizer

    attention = use_for_run(precision, BATCH, SHAPE["n_head"], SHAPE["block_size"], SHAPE["n_embd"])
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE))
    optimizer, schedule = build_optimizer(model, OptimConfig(), 10_000, fused=False if plain else None)
    if compiled:
        model.compile()
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, SHAPE["vocab_size"], (BATCH, SHAPE["block_size"]), generator=gen) for _ in range(2))
    bf16 = precision == "bf16-mixed"

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            _, loss = model(x, y)
        loss.backward()
        with torch.profiler.record_function("clip_grad_norm"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()

    with plain_path() if plain else contextlib.nullcontext():
        start = time.perf_counter()
        step()
        first = time.perf_counter() - start
        for _ in range(2):
            step()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(profiled):
                step()
    by_kind: dict[str, float] = {}
    for event in prof.events():
        kind = kind_of(event)
        by_kind[kind] = by_kind.get(kind, 0.0) + event.self_cpu_time_total / 1e3 / profiled  # ms per step
    step_s = statistics.median(times)
    return {
        "precision": precision,
        "compile": compiled,
        "plain": plain,
        "step_ms": 1e3 * step_s,
        "compile_s": max(0.0, first - step_s) if compiled else 0.0,
        "flops": model.flops_per_token() * BATCH * SHAPE["block_size"],
        "by_kind": by_kind,
        "attention": "SDPA's default kernel (the plain path)" if plain else attention,
    }


def label(r: dict) -> str:
    dtype = "bf16" if r["precision"] == "bf16-mixed" else "fp32"
    return f"{dtype} {'compiled' if r['compile'] else 'eager'}" + (" plain" if r["plain"] else "")


def run(quick: bool = False, max_steps: int = 500) -> list[dict]:
    """Measure every configuration this CPU can run, print the anatomy table and the goals; return the rows."""
    from resnorm_lm.train.precision import missing_native_bf16

    steps, profiled = (4, 1) if quick else (10, 3)
    configs = [("32-true", False, True), ("32-true", False, False)]
    emulated = missing_native_bf16()
    if emulated is None:
        configs += [("bf16-mixed", False, True), ("bf16-mixed", False, False)]
    if not quick:
        configs += [(p, True, False) for p, c, plain in configs if not plain]
    peaks = {"32-true": gemm_peak(torch.float32)}
    if emulated is None:
        peaks["bf16-mixed"] = gemm_peak(torch.bfloat16)
    rows = []
    for precision, compiled, plain in configs:
        rows.append(measure(precision, compiled, steps, profiled, plain))
        print(f"  measured {label(rows[-1])}: {rows[-1]['step_ms']:.0f} ms per step", flush=True)
    print_table(rows, peaks, emulated, max_steps)
    return rows


def print_table(rows: list[dict], peaks: dict[str, float], emulated: str | None, max_steps: int) -> None:
    print(
        f"\nthe cpu-profile step (prenorm-12l, {BATCH} x {SHAPE['block_size']} tokens, {torch.get_num_threads()} "
        "threads): self CPU ms per step by kind, share of the profiled step"
    )
    print(f"{'kind':26}" + "".join(f"{label(r):>26}" for r in rows))
    for kind in [k for k, _ in KINDS] + [OTHER]:
        cells = []
        for r in rows:
            ms, total = r["by_kind"].get(kind, 0.0), sum(r["by_kind"].values())
            cells.append(f"{ms:8.1f} ms {ms / total:6.1%}".rjust(26))
        print(f"{kind[:26]:26}" + "".join(cells))
    print(f"{'step (unprofiled median)':26}" + "".join(f"{r['step_ms']:23.0f} ms" for r in rows))
    print(f"{'model GFLOP/s':26}" + "".join(f"{r['flops'] / r['step_ms'] / 1e6:26.0f}" for r in rows))
    print(
        f"{'share of the GEMM peak':26}"
        + "".join(f"{r['flops'] / r['step_ms'] / 1e6 / peaks[r['precision']]:26.2f}" for r in rows)
    )
    print(
        "GEMM peak (2048^3, same threads): "
        + ", ".join(f"{'bf16' if p == 'bf16-mixed' else 'fp32'} {g:.0f} GFLOP/s" for p, g in peaks.items())
    )
    if emulated:
        print(f"bf16-mixed not measured: {emulated}")
    for r in rows:
        if not r["plain"] and not r["compile"]:
            print(f"{label(r)}: {r['attention']}")
    for r in rows:
        if r["compile"]:
            eager = next(
                e for e in rows if (e["precision"], e["compile"], e["plain"]) == (r["precision"], False, False)
            )
            saving = eager["step_ms"] - r["step_ms"]
            pays = saving > 0 and saving * max_steps / 1e3 > r["compile_s"]
            print(
                f"torch.compile, {label(r)}: {r['compile_s']:.0f} s to compile, {saving:+.0f} ms per step saved: "
                f"over {max_steps} steps it {'pays' if pays else 'does not pay'}"
            )
    plain = next(r for r in rows if r["plain"] and r["precision"] == "32-true")
    fastest = min((r for r in rows if not r["plain"]), key=lambda r: r["step_ms"])
    fp32 = next(r for r in rows if (r["precision"], r["compile"], r["plain"]) == ("32-true", False, False))
    print(f"fp32 eager against fp32 eager plain: {plain['step_ms'] / fp32['step_ms']:.2f}x as fast")
    print(
        f"fastest step ({label(fastest)}) against fp32 eager plain: "
        f"{plain['step_ms'] / fastest['step_ms']:.2f}x as fast (the goal where bf16 is native: 2x)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps, eager only")
    args = parser.parse_args()
    run(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())

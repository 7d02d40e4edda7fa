"""What subnormal floats cost a training step: runs' weights timed with subnormals kept and flushed to zero.

A run whose first blocks' gradients vanish (post-norm at 24 blocks above its LR, depth.md) carries gradients
below float32's smallest normal number (1.18e-38). On many CPUs an operation on a subnormal value is far slower
than on a normal one, so such a run trains far slower than its neighbours with no change of what it computes.
This script measures it at each run's checkpoint: one forward and backward pass of the chunked loss (the training
path, no optimizer step) on a validation batch, timed in paired rounds with `torch.set_flush_denormal` off (the
protocol's arithmetic) and on, and the subnormal values that pass leaves in the gradients.

    python benchmarks/bench_subnormals.py RUN_DIR_OR_CKPT ... [--rounds 4] [--batch 16]

Prints one row a run: the median seconds a step over the rounds after the first, flushed and not, their ratio,
and the subnormal gradients. Flushing changes the arithmetic where subnormals arise (they become zeros), so the
suites do not flush; this measures what that costs. Measured figures only, no assertion on a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import torch

SMALLEST_NORMAL = torch.finfo(torch.float32).tiny  # 1.18e-38


def subnormal_count(tensors: Iterable[torch.Tensor]) -> tuple[int, int]:
    """(values strictly between 0 and float32's smallest normal in magnitude, all values) over the tensors."""
    subnormal = total = 0
    for t in tensors:
        magnitude = t.detach().abs().float()
        subnormal += int(((magnitude > 0) & (magnitude < SMALLEST_NORMAL)).sum())
        total += t.numel()
    return subnormal, total


def step_seconds(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """One forward and backward pass of the loss, x and y (B, T) token ids, timed."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    _, loss = model(x, y)  # the chunked loss, as in training
    loss.backward()
    return time.perf_counter() - start


def flush_supported() -> bool:
    """Whether this CPU can flush subnormals (torch says so by the return of set_flush_denormal); left off."""
    supported = torch.set_flush_denormal(True)
    torch.set_flush_denormal(False)
    return supported


def measure(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, rounds: int) -> dict[str, float]:
    """Paired rounds, flushing on then off in each; the first round (warm-up) left out of the medians. The last
    pass is unflushed, so its gradients are the ones counted."""
    kept, flushed = [], []
    try:
        for _ in range(rounds):
            torch.set_flush_denormal(True)
            flushed.append(step_seconds(model, x, y))
            torch.set_flush_denormal(False)
            kept.append(step_seconds(model, x, y))
    finally:
        torch.set_flush_denormal(False)
    subnormal, total = subnormal_count(p.grad for p in model.parameters() if p.grad is not None)
    kept_s, flushed_s = statistics.median(kept[1:] or kept), statistics.median(flushed[1:] or flushed)
    return {
        "kept_s": kept_s,
        "flushed_s": flushed_s,
        "ratio": kept_s / flushed_s,
        "subnormal_grads": subnormal,
        "grads": total,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (their last.ckpt) or .ckpt files")
    parser.add_argument("--rounds", type=int, default=4, help="paired rounds; the first is a warm-up")
    parser.add_argument(
        "--batch", type=int, default=16, help="validation windows a batch (fewer if the split is shorter)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.batch < 1:
        parser.error("--rounds and --batch must be positive")
    if not flush_supported():
        print("this CPU cannot flush subnormals (torch.set_flush_denormal returned False): nothing to compare")
        return 1
    from resnorm_lm.analysis.block_measurements import validation_slice
    from resnorm_lm.train.loaded_run import load_run

    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); {args.rounds} paired rounds\n")
    print("| run | step | s a step | flushed | kept / flushed | subnormal gradients |")
    print("|---|---|---|---|---|---|")
    for path in args.runs:
        run = load_run(path)  # weights_only: a checkpoint is data
        model = run.model.model.train()
        dm = run.datamodule
        x, y = validation_slice(dm, args.batch * dm.block_size)  # (N, T) each, N up to --batch
        m = measure(model, x, y, args.rounds)
        print(
            f"| {path} | {run.global_step} | {m['kept_s']:.2f} | {m['flushed_s']:.2f} | {m['ratio']:.2f} | "
            f"{m['subnormal_grads']:,} of {m['grads']:,} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

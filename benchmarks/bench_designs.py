"""What each design costs beside pre-norm: parameters, FLOPs per token, activation memory and the time of a step.

    python benchmarks/bench_designs.py                        # the designs suite's recipes, cpu profile shapes
    python benchmarks/bench_designs.py --recipes hc-12l mhc-12l --rounds 7 --device cuda

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` over one forward and backward (matrix products
and attention; elementwise work, such as Sinkhorn's normalizations or a norm, is not counted), per token. The step
time is forward, backward and an AdamW step on random tokens, in fp32, eager; each round times every recipe once in
a shuffled order, and the ratio to pre-norm is the median of the rounds' ratios (a loaded machine moves both sides
of a round alike). The activation memory is what autograd keeps for the backward pass of one forward (each storage
once, the parameters not counted): it does not depend on the machine, and it is where a widened stream shows (HC
and mHC carry 4 copies of the (B, T, C) stream). On CUDA the peak allocated memory of a step is printed too. A
benchmark prints what it measured; it decides nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from resnorm_lm.analysis.equal_compute import counted_flops_per_token  # noqa: E402
from resnorm_lm.model.gpt import GPT, count_parameters  # noqa: E402
from resnorm_lm.train.recipes import recipe_arch  # noqa: E402

DESIGNS = [
    "prenorm-12l",
    "hc-12l",
    "mhc-12l",
    "attnres-12l",
    "attnres_block-12l",
    "denseformer-12l",
    "olmo2-12l",
    "prenorm-12l-qknorm",
    "prenorm-12l-qknorm-head",
    "prenorm-12l-derf",
    "prenorm-12l-dyt-paper",
]


def saved_for_backward_bytes(model: GPT, idx: torch.Tensor) -> int:
    """Bytes autograd keeps for the backward pass of one forward on ``idx`` (B, T): every tensor saved for
    backward, each underlying storage counted once (views share it), parameters and their storages excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, loss = model(idx, idx)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values())


def peak_step_bytes(model: GPT, optimizer: torch.optim.Optimizer, idx: torch.Tensor) -> int | None:
    """Peak CUDA memory allocated over one training step (None on a CPU, where torch does not track it)."""
    if not idx.is_cuda:
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step_seconds(model, optimizer, idx, steps=1)
    return torch.cuda.max_memory_allocated()


def step_seconds(model: GPT, optimizer: torch.optim.Optimizer, idx: torch.Tensor, steps: int) -> float:
    """Mean seconds of ``steps`` training steps (forward, backward, AdamW) after one untimed step."""
    for i in range(steps + 1):
        if i == 1:
            start = time.perf_counter()
        _, loss = model(idx, idx)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if idx.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", default=DESIGNS, help="the first is the reference (default prenorm)")
    parser.add_argument("--profile", default="cpu", help="whose model shapes (recipes/profiles/<profile>.yaml)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per step (the cpu profile's 16)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per recipe per round")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    reference = args.recipes[0]
    models, optimizers, rows = {}, {}, {}
    for recipe in args.recipes:
        torch.manual_seed(0)
        cfg = recipe_arch(recipe, args.profile)
        model = GPT(cfg).to(device)
        idx = torch.randint(cfg.vocab_size, (args.batch, cfg.block_size), device=device)
        models[recipe], optimizers[recipe] = (model, idx), torch.optim.AdamW(model.parameters(), lr=1e-4)
        rows[recipe] = {
            "params": count_parameters(model),
            "flops": counted_flops_per_token(model, idx),
            "saved": saved_for_backward_bytes(model, idx),
            "peak": peak_step_bytes(model, optimizers[recipe], idx),
            "ratios": [],
        }
    for round_ in range(args.rounds):
        order = list(args.recipes)
        random.Random(round_).shuffle(order)
        seconds = {r: step_seconds(models[r][0], optimizers[r], models[r][1], args.steps) for r in order}
        for recipe in args.recipes:
            rows[recipe]["ratios"].append(seconds[recipe] / seconds[reference])
        rows[reference].setdefault("seconds", []).append(seconds[reference])
        print(f"round {round_ + 1}/{args.rounds}: {reference} {seconds[reference]:.3f} s a step", flush=True)
    base = rows[reference]
    print(f"\n{args.profile} profile shapes, batch {args.batch}, fp32 eager on {device}, torch {torch.__version__}")
    print(f"{reference}: {statistics.median(base['seconds']):.3f} s a step (median of {args.rounds} rounds)\n")
    peak = "" if base["peak"] is None else " peak CUDA memory | x ref |"
    print(
        "| recipe | parameters | x ref | FLOPs/token (counted) | x ref | saved for backward | x ref |"
        f"{peak} step time x ref (median, min..max) |"
    )
    print("|---" * (10 if peak else 8) + "|")
    for recipe, row in rows.items():
        ratios = row["ratios"]
        print(
            f"| {recipe} | {row['params'] / 1e6:.3f}M | {row['params'] / base['params']:.3f} | "
            f"{row['flops'] / 1e6:.2f}M | {row['flops'] / base['flops']:.3f} | "
            f"{row['saved'] / 2**20:.1f} MiB | {row['saved'] / base['saved']:.2f} | "
            + ("" if row["peak"] is None else f"{row['peak'] / 2**20:.0f} MiB | {row['peak'] / base['peak']:.2f} | ")
            + f"{statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f}) |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

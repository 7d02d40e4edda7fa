"""``precision: auto``: the fastest precision the hardware really supports, measured, and said aloud.

On CUDA: ``bf16-mixed`` where the GPU supports bf16, else ``16-mixed`` (with its grad scaler).
On CPU: ``bf16-mixed`` only where a bf16 matmul is measurably faster than an fp32 one on this
machine (CPUs with AVX512_BF16 or AMX), else ``32-true``. Without native bf16 arithmetic, bf16 is
emulated and runs tens of times slower than fp32 (28x to 130x measured on AVX2-only CPUs), which
reading CPU flags alone would not tell as reliably as a timing does.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass

import torch

AUTO = "auto"
BF16_MIN_SPEEDUP = 1.1  # bf16 must beat fp32 by this factor on CPU: a tie keeps the exact arithmetic
PROBE_SIZE = 256  # square matmul of the probe: about the size of the cpu profile's layers
PROBE_BUDGET_S = 0.05  # timing budget per dtype (one slow bf16 multiply may exceed it: it runs once then)


class PrecisionError(ValueError):
    """A precision this hardware cannot run, or a resume that cannot keep its precision."""


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision to run at and why: printed at start-up and recorded in the run's manifest."""

    precision: str
    reason: str

    def describe(self) -> str:
        return f"precision {self.precision} ({self.reason})"


def _best_time(fn, budget_s: float, max_reps: int = 20) -> float:
    """Fastest of a few timed calls after one warm-up call; stops when the budget is spent."""
    fn()  # warm-up: kernel selection, packing, first-touch allocation
    best, spent, reps = float("inf"), 0.0, 0
    while reps < max_reps and (reps < 2 or spent < budget_s):
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        best, spent, reps = min(best, elapsed), spent + elapsed, reps + 1
        if elapsed > 4 * budget_s:  # a very slow dtype: one measurement says enough
            break
    return best


@functools.cache
def cpu_bf16_speedup(size: int = PROBE_SIZE) -> float:
    """fp32 matmul time / bf16 matmul time on this CPU (> 1: bf16 is faster). Measured once per process."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=gen), torch.randn(size, size, generator=gen)
    a16, b16 = a.bfloat16(), b.bfloat16()
    fp32 = _best_time(lambda: torch.mm(a, b), PROBE_BUDGET_S)
    bf16 = _best_time(lambda: torch.mm(a16, b16), PROBE_BUDGET_S)
    return fp32 / bf16


def choose_auto(cuda: bool) -> PrecisionChoice:
    """What ``auto`` means on this machine (CUDA when ``cuda``, else this process's CPU)."""
    if cuda:
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice("bf16-mixed", f"{torch.cuda.get_device_name()} supports bf16")
        return PrecisionChoice("16-mixed", f"{torch.cuda.get_device_name()} has no bf16: fp16 with a grad scaler")
    speedup = cpu_bf16_speedup()
    relative = f"{speedup:.2f}x as fast as" if speedup >= 1 else f"{1 / speedup:.0f}x slower than"
    measured = f"a {PROBE_SIZE}x{PROBE_SIZE} bf16 matmul ran {relative} fp32 on this CPU"
    if speedup >= BF16_MIN_SPEEDUP:
        return PrecisionChoice("bf16-mixed", measured)
    return PrecisionChoice("32-true", f"{measured}: no fast native bf16 here")


def check_runnable(precision: str, cuda: bool) -> str:
    """A concrete precision as this hardware can run it: 16-mixed becomes bf16-mixed on CPU; 16-true is refused."""
    if cuda:
        return precision
    if precision in ("16-true", "half"):
        raise PrecisionError(
            "precision 16-true is refused on CPU: fp16 weights without a grad scaler give NaN losses here; "
            "use --trainer.precision=auto (default), bf16-mixed or 32-true"
        )
    if precision in ("16-mixed", "16"):  # "16" is Lightning's alias of 16-mixed
        print("resnorm-lm: precision 16-mixed needs a CUDA GPU; switching to bf16-mixed on CPU", file=sys.stderr)
        return "bf16-mixed"
    return precision


def uses_cuda(accelerator: str | None) -> bool:
    """Whether a Trainer with this ``accelerator`` setting runs on CUDA."""
    if accelerator in ("gpu", "cuda"):
        return True
    return accelerator in (None, "auto") and torch.cuda.is_available()


def resolve_precision(requested: str | int | None, cuda: bool, resumed_with: str | None = None) -> PrecisionChoice:
    """The precision a run uses: an explicit setting wins; ``auto`` (or none) keeps a resumed run's
    precision where the hardware can run it, else measures what is fastest here."""
    text = AUTO if requested is None else str(requested)
    if text != AUTO:
        return PrecisionChoice(check_runnable(text, cuda), "set explicitly")
    if resumed_with is not None:
        if resumed_with == "16-mixed" and not cuda:
            choice = choose_auto(cuda)
            return PrecisionChoice(choice.precision, f"the run was started with 16-mixed, which needs a CUDA GPU; "
                                                     f"{choice.reason}")  # fmt: skip
        if resumed_with == "bf16-mixed" and cuda and not torch.cuda.is_bf16_supported():
            return PrecisionChoice("16-mixed", "the run was started with bf16-mixed, which this GPU does not support")
        note = "kept from the checkpoint: a resumed run keeps its precision; --trainer.precision=... changes it"
        return PrecisionChoice(resumed_with, note)
    return choose_auto(cuda)


def set_matmul_precision_for(cuda: bool) -> None:
    """On CUDA, let fp32 matmuls use TF32 tensor cores (Lightning warns while this is unset)."""
    if cuda:
        torch.set_float32_matmul_precision("high")

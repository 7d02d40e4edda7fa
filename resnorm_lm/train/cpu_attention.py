"""Attention on a CPU: the faster of SDPA's flash and math backends for the run's dtype and shape, measured.

torch's CPU flash-attention kernel is the faster in fp32, but its bf16 backward is several times slower than
the math backend's (measured on an AVX512_BF16 Xeon: 15.4 against 5.1 ms for one layer's forward and backward
at the cpu profile's shape; on an AVX512_BF16 EPYC the whole bf16 step 15% faster with math). Which wins
depends on the CPU, so it is measured once per machine, dtype and shape, like ``precision: auto``, and kept in
``$RESNORM_LM_CACHE/attention/``::

    python -m resnorm_lm.train.cpu_attention                       # the choice for the cpu profile here
    python -m resnorm_lm.train.cpu_attention --dtype bf16 --measure

Both backends are exact to their dtype's rounding (tests/test_cpu_attention.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from resnorm_lm.data.cache import default_cache_dir, sha256_json
from resnorm_lm.model.layers import use_cpu_sdpa_backend
from resnorm_lm.train.hardware import interleaved_thread_times, kept_per_machine, machine_key

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PAIRS = 5  # interleaved (flash, math) timings; the lower median decides
ATTENTION_ENV = "RESNORM_LM_CPU_ATTENTION"  # flash | math: this backend, not measured (the portable arithmetic)
PROBE_VERSION = 1
PROBE_SCORES = 1 << 24  # at most this many attention scores in the probe (64 MiB of fp32): the cpu profile has 2^20


@dataclass(frozen=True)
class AttentionProbe:
    """One measurement of SDPA's CPU backends at one dtype and shape (batch, heads, length, head width)."""

    dtype: str
    shape: list[int]
    flash_ms: float  # median CPU time of one forward and backward on one thread
    math_ms: float
    pairs: int
    measured: str

    @property
    def backend(self) -> str:
        """The faster backend."""
        return "math" if self.math_ms < self.flash_ms else "flash"

    def describe(self) -> str:
        b, h, t, d = self.shape
        return (
            f"attention on CPU in {self.dtype}: SDPA's {self.backend} backend ({self.math_ms:.1f} ms math, "
            f"{self.flash_ms:.1f} ms flash for the forward and backward of {b} x {h} heads x {t} x {d}, "
            f"medians of {self.pairs} interleaved pairs of one thread's CPU time)"
        )


def measure(dtype: str, shape: tuple[int, int, int, int], pairs: int = PAIRS) -> AttentionProbe:
    """Time causal SDPA forward and backward under each backend on one thread, interleaved (see precision.py)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen).to(DTYPES[dtype]).requires_grad_() for _ in range(3))  # (B,H,T,D)
    grad = torch.randn(shape, generator=gen).to(DTYPES[dtype])

    def once(backend: str) -> float:
        start = time.thread_time()
        with sdpa_kernel(BACKENDS[backend]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
        q.grad = k.grad = v.grad = None
        return time.thread_time() - start

    times = interleaved_thread_times({name: lambda name=name: once(name) for name in BACKENDS}, pairs)
    return AttentionProbe(
        dtype=dtype,
        shape=list(shape),
        flash_ms=1e3 * statistics.median(times["flash"]),
        math_ms=1e3 * statistics.median(times["math"]),
        pairs=pairs,
        measured=time.strftime("%Y-%m-%d %H:%M"),
    )


def choose(dtype: str, shape: tuple[int, int, int, int], remeasure: bool = False) -> tuple[AttentionProbe, str]:
    """The probe for this machine, dtype and shape: kept, or measured now; and where it came from."""
    key = {**machine_key(), "dtype": dtype, "shape": list(shape), "attention_probe": PROBE_VERSION}
    path = default_cache_dir() / "attention" / f"cpu-sdpa-{sha256_json(key)[:16]}.json"
    again = f"python -m resnorm_lm.train.cpu_attention --dtype {dtype} --measure"
    return kept_per_machine(path, key, lambda: measure(dtype, shape), lambda d: AttentionProbe(**d), again, remeasure)


def dtype_of(precision: str) -> str | None:
    """The dtype attention computes in under a Lightning precision; None where no choice is made (fp64, fp16)."""
    if precision.startswith("bf16"):
        return "bf16"
    return "fp32" if precision.startswith("32") else None


def probe_shape(batch: int, n_head: int, length: int, head_width: int) -> tuple[int, int, int, int]:
    """The run's attention shape, shrunk (batch first, then length) until the math backend's score matrix has at
    most PROBE_SCORES entries: a long context must not make the probe itself run out of memory."""
    while batch > 1 and batch * n_head * length**2 > PROBE_SCORES:
        batch //= 2
    length = min(length, max(1, int((PROBE_SCORES / (batch * n_head)) ** 0.5)))
    return batch, n_head, length, head_width


def use_for_run(precision: str, batch: int, n_head: int, block_size: int, n_embd: int) -> str | None:
    """Measure (or read) and set this process's CPU attention backend for a run; the line that says so."""
    dtype = dtype_of(precision)
    if dtype is None:
        return None
    fixed = os.environ.get(ATTENTION_ENV)
    if fixed is not None:
        if fixed not in BACKENDS:
            raise ValueError(f"{ATTENTION_ENV}={fixed!r}: one of {', '.join(sorted(BACKENDS))}, or unset to measure")
        use_cpu_sdpa_backend(DTYPES[dtype], BACKENDS[fixed])
        return f"attention on CPU in {dtype}: SDPA's {fixed} backend (set by {ATTENTION_ENV}, not measured)"
    probe, source = choose(dtype, probe_shape(batch, n_head, block_size, n_embd // n_head))
    use_cpu_sdpa_backend(DTYPES[dtype], BACKENDS[probe.backend])
    return f"{probe.describe()}; {source}"


def main(argv: list[str] | None = None) -> int:
    """``python -m resnorm_lm.train.cpu_attention``: which SDPA backend attention uses on this CPU, and why."""
    parser = argparse.ArgumentParser(prog="python -m resnorm_lm.train.cpu_attention", description=main.__doc__)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument(
        "--shape",
        type=int,
        nargs=4,
        default=[16, 4, 128, 32],
        metavar=("B", "H", "T", "D"),
        help="batch, heads, length, head width (default: the cpu profile's)",
    )
    parser.add_argument("--measure", action="store_true", help="measure again and replace the kept result")
    args = parser.parse_args(argv)
    probe, source = choose(args.dtype, tuple(args.shape), remeasure=args.measure)
    print(f"resnorm-lm: {probe.describe()}; {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

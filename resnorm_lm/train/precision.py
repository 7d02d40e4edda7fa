"""``precision: auto``: the fastest precision the hardware really supports, measured and said aloud; and the
``Trainer`` that takes it."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch

from resnorm_lm.data.cache import default_cache_dir, sha256_json
from resnorm_lm.errors import ResnormError
from resnorm_lm.train.hardware import (
    cpu_features,
    interleaved_thread_times,
    is_x86,
    kept_per_machine,
    machine_key,
    native_bf16_flags,
)

AUTO = "auto"
# bf16 must beat fp32 on the probe by this factor. The probe times the part of a step that bf16 speeds up most;
# the rest (cross-entropy over the vocabulary, attention, norms, AdamW, casts) gains little or loses. On the
# AVX512_BF16 EPYC a probe of 1.8x-2.6x came with whole steps 5-8% faster: much less on the probe promises no gain
# on a step. Emulated bf16 measures 0.1x-0.6x. 1.5x lies clear of both, and a tie keeps the exact arithmetic.
BF16_MIN_SPEEDUP = 1.5
# The probe's shape is the cpu profile's (recipes/profiles/cpu.yaml): 16 x 128 token rows, width 128, MLP 4x.
PROBE_ROWS, PROBE_WIDTH, PROBE_HIDDEN = 16 * 128, 128, 4 * 128
PROBE_PAIRS = 7  # interleaved (fp32, bf16) timings, about 0.5 s of CPU; the median of their ratios decides
PROBE_VERSION = 2  # bump when the probe changes: results kept from an older probe are then measured again
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) below avx512_core_bf16: bf16 matmuls are emulated under them
ONEDNN_ISAS_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"}


class PrecisionError(ResnormError, ValueError):
    """A precision this hardware cannot run, or a resume that cannot keep its precision."""


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision to run at and why: printed at start-up and recorded in the run's manifest."""

    precision: str
    reason: str

    def describe(self) -> str:
        return f"precision {self.precision} ({self.reason})"


# ---------------------------------------------------------------- the gate: what this CPU (and process) can do


def missing_native_bf16() -> str | None:
    """Why this process cannot run bf16 natively on the CPU; None where it can."""
    features = cpu_features()
    cpu = features.get("cpu_name") or "this CPU"
    if not native_bf16_flags(features):
        flags = "avx512_bf16 and amx_bf16" if is_x86(features) else "the bf16 flag"
        return f"{cpu} lacks {flags}: bf16 would be emulated, tens of times slower than fp32"
    if not is_x86(features):
        return None  # the x86 capping variables below mean nothing on Arm; the probe decides there
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX512"):  # ATEN_CPU_CAPABILITY=avx2 caps torch's own kernels
        return (
            f"torch's CPU capability is {capability} here (ATEN_CPU_CAPABILITY), below AVX512: bf16 would be emulated"
        )
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):  # oneDNN's variable, and its older name
        isa = os.environ.get(name, "")
        if isa.strip().upper() in ONEDNN_ISAS_WITHOUT_BF16:
            return f"{name}={isa} caps oneDNN below avx512_core_bf16: its bf16 matmuls would be emulated"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN, which runs CPU bf16 matmuls natively"
    return None


# ---------------------------------------------------------------- the probe: a training step's matmuls, timed


@dataclass(frozen=True)
class Bf16Probe:
    """One measurement of bf16 against fp32 on this CPU."""

    speedup: float  # median over interleaved pairs of fp32 time / bf16 time (> 1: bf16 is faster)
    fp32_ms: float  # median time of one fp32 forward and backward
    bf16_ms: float  # the same under bf16 autocast
    pairs: int
    measured: str  # when (local time)

    def describe(self) -> str:
        relative = f"{self.speedup:.2f}x as fast as" if self.speedup >= 1 else f"{1 / self.speedup:.1f}x slower than"
        return (
            f"the forward and backward of a {PROBE_WIDTH}->{PROBE_HIDDEN}->{PROBE_WIDTH} MLP on {PROBE_ROWS} rows "
            f"ran {relative} fp32 under bf16 autocast ({self.bf16_ms:.1f} ms against {self.fp32_ms:.1f} ms of "
            f"one thread's CPU time, medians of {self.pairs} interleaved pairs)"
        )


def measure_cpu_bf16(pairs: int = PROBE_PAIRS) -> Bf16Probe:
    """Time the MLP of the cpu profile, forward and backward, in fp32 and under bf16 autocast, interleaved.

    The probe runs on one thread and counts that thread's CPU time: it measures what the arithmetic
    costs, which other processes cannot change, where wall time on a loaded machine measures mostly
    how OpenMP threads wait for each other (seen: 1 s for a 40 ms call, the same for both dtypes).
    Pairs alternate their order, and the median of the per-pair ratios decides. A fit measures after the
    run's seed is set and before its model is built: the probe's weights come from a forked RNG, so the
    run's weights are the same whether the probe was measured now or read from the cache.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(
            torch.nn.Linear(PROBE_WIDTH, PROBE_HIDDEN), torch.nn.GELU(), torch.nn.Linear(PROBE_HIDDEN, PROBE_WIDTH)
        )
        x = torch.randn(PROBE_ROWS, PROBE_WIDTH, requires_grad=True)  # (rows, C)

    def step(bf16: bool) -> float:
        start = time.thread_time()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = mlp(x)  # (rows, C), bf16 under autocast
        y.float().square().mean().backward()
        mlp.zero_grad(set_to_none=True)
        x.grad = None
        return time.thread_time() - start

    times = interleaved_thread_times({"fp32": lambda: step(False), "bf16": lambda: step(True)}, pairs)
    fp32, bf16 = times["fp32"], times["bf16"]
    return Bf16Probe(
        speedup=statistics.median(f / h for f, h in zip(fp32, bf16)),
        fp32_ms=1e3 * statistics.median(fp32),
        bf16_ms=1e3 * statistics.median(bf16),
        pairs=pairs,
        measured=time.strftime("%Y-%m-%d %H:%M"),
    )


# ---------------------------------------------------------------- kept per machine in $RESNORM_LM_CACHE


def probe_cache_path(key: dict) -> Path:
    return default_cache_dir() / "precision" / f"cpu-bf16-{sha256_json(key)[:16]}.json"


def cpu_bf16_probe(measure: bool = False) -> tuple[Bf16Probe, str]:
    """This machine's probe and where it came from: kept in the cache, or measured now (always when ``measure``)."""
    key = {**machine_key(), "probe": PROBE_VERSION}
    return kept_per_machine(
        probe_cache_path(key),
        key,
        lambda: measure_cpu_bf16(),
        lambda d: Bf16Probe(**d),
        "python -m resnorm_lm.train.precision --measure",
        measure,
    )


def choose_auto(cuda: bool, measure: bool = False) -> PrecisionChoice:
    """What ``auto`` means on this machine (CUDA when ``cuda``, else this process's CPU)."""
    if cuda:
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice("bf16-mixed", f"{torch.cuda.get_device_name()} supports bf16")
        return PrecisionChoice("16-mixed", f"{torch.cuda.get_device_name()} has no bf16: fp16 with a grad scaler")
    missing = missing_native_bf16()
    if missing is not None:
        return PrecisionChoice("32-true", missing)
    probe, source = cpu_bf16_probe(measure)
    if probe.speedup >= BF16_MIN_SPEEDUP:
        return PrecisionChoice("bf16-mixed", f"{probe.describe()}; {source}")
    return PrecisionChoice(
        "32-true", f"{probe.describe()}, less than the {BF16_MIN_SPEEDUP}x that bf16 must gain; {source}"
    )


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
            return PrecisionChoice(
                choice.precision, f"the run was started with 16-mixed, which needs a CUDA GPU; {choice.reason}"
            )
        if resumed_with == "bf16-mixed" and cuda and not torch.cuda.is_bf16_supported():
            return PrecisionChoice("16-mixed", "the run was started with bf16-mixed, which this GPU does not support")
        note = "kept from the checkpoint: a resumed run keeps its precision; --trainer.precision=... changes it"
        return PrecisionChoice(resumed_with, note)
    return choose_auto(cuda)


TF32_ENV = "RESNORM_LM_TF32"  # off: fp32 matmuls on a GPU in full fp32 (the portable arithmetic: arithmetic.py)


def tf32_wanted() -> bool:
    """Whether fp32 matmuls on a GPU may use TF32 tensor cores: yes unless ``RESNORM_LM_TF32=off``."""
    value = os.environ.get(TF32_ENV, "on").lower()
    if value not in ("on", "off"):
        raise PrecisionError(f"{TF32_ENV}={value!r}: on (TF32 matmuls on a GPU, the default) or off (full fp32)")
    return value == "on"


def set_matmul_precision_for(cuda: bool) -> None:
    """On CUDA, let fp32 matmuls use TF32 tensor cores (Lightning warns while this is unset), unless
    ``RESNORM_LM_TF32=off`` asks for full fp32."""
    if cuda:
        torch.set_float32_matmul_precision("high" if tf32_wanted() else "highest")


def main(argv: list[str] | None = None) -> int:
    """``python -m resnorm_lm.train.precision [--measure]``: what ``auto`` chooses on this machine's CPU, and why."""
    parser = argparse.ArgumentParser(prog="python -m resnorm_lm.train.precision", description=main.__doc__)
    parser.add_argument(
        "--measure",
        action="store_true",
        help="time bf16 against fp32 again and replace the result kept for this machine",
    )
    args = parser.parse_args(argv)
    print(f"resnorm-lm: {choose_auto(cuda=False, measure=args.measure).describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ---------------------------------------------------------------- the Trainer that takes ``auto``
#
# It earns its place by its signature: LightningCLI validates a config's ``trainer.precision`` against it, and
# Lightning's own has no ``auto``. The CLI resolves ``auto`` before the Trainer is built (and says what it chose);
# a Trainer built in Python with ``auto`` resolves it here.


class Trainer(L.Trainer):
    """``L.Trainer`` plus ``precision: auto`` (the default) and TF32 matmuls on CUDA (unless RESNORM_LM_TF32=off).

    Args:
        precision: ``auto`` (the fastest of bf16-mixed and 32-true that this hardware really runs fast,
            measured; bf16-mixed or 16-mixed on CUDA) or any precision Lightning accepts.
        *args, **kwargs: everything else, as for ``lightning.Trainer``.
    """

    def __init__(self, *args, precision: str | int | None = AUTO, **kwargs) -> None:
        cuda = uses_cuda(kwargs.get("accelerator", "auto"))
        if precision in (AUTO, None):
            precision = resolve_precision(precision, cuda).precision
        set_matmul_precision_for(cuda)
        super().__init__(*args, precision=precision, **kwargs)

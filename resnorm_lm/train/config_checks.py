"""Settings checked before anything is built, prepared or written.

Lightning checks some trainer numbers late (after data preparation, or after the whole run: a
``checkpoint_every`` of 0 divides by zero at the end) or not at all (a negative accumulation trains
on). The checks here say what is wrong and what to use instead, so a mistake costs seconds, not a run:
the trainer's numbers, the hardware a setting needs, and whether the model fits in memory at all.
"""

from __future__ import annotations

import os
from typing import Any

import torch

BYTES_PER_PARAM = 16  # fp32 weights, gradients and AdamW's two moments


def check_trainer_numbers(trainer: dict[str, Any]) -> list[str]:
    """Problems with the trainer's numeric settings, each with the allowed range."""
    problems = []

    def whole(key: str, minimum: int, allowed: str, extra: tuple = ()) -> None:
        value = trainer.get(key)
        if value is None or value in extra:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            problems.append(f"trainer.{key}={value!r}: {allowed}")

    whole("max_steps", 1, "the optimizer steps of the run and of its LR schedule, an integer >= 1")
    whole("accumulate_grad_batches", 1, "micro-batches per optimizer step, an integer >= 1")
    whole("log_every_n_steps", 1, "an integer >= 1")
    whole("num_nodes", 1, "an integer >= 1")
    whole("num_sanity_val_steps", -1, "an integer >= 0 (-1: the whole validation split)")
    for key in ("val_check_interval", "limit_val_batches", "limit_test_batches"):
        value = trainer.get(key)
        if value is None or isinstance(value, bool):
            continue
        low = 0 if key == "limit_val_batches" else 1  # 0 test batches would leave the run without its test loss
        if isinstance(value, float) and value.is_integer() and value > 1:
            value = int(value)  # a count that the parser typed as float
        if (isinstance(value, int) and value < low) or (isinstance(value, float) and not 0 < value <= 1):
            what = "validate every N micro-batches" if key == "val_check_interval" else "batches of the split"
            problems.append(f"trainer.{key}={value!r}: an integer >= {low} ({what}) or a fraction in (0, 1]")
    clip = trainer.get("gradient_clip_val")
    if clip is not None and not clip >= 0:
        problems.append(f"trainer.gradient_clip_val={clip!r}: a norm >= 0 (0 or null: no clipping)")
    devices = trainer.get("devices")
    if isinstance(devices, str) and devices.lstrip("-").isdigit():  # the parser keeps "0" a string
        devices = int(devices)
    if isinstance(devices, int) and not isinstance(devices, bool) and devices < 1 and devices != -1:
        problems.append(f"trainer.devices={devices!r}: a count >= 1, -1 or auto (every device), or a list of ids")
    return problems


def check_hardware(accelerator: str | None) -> str | None:
    """A setting that asks for a GPU on a machine without one (the gpu profile on a laptop)."""
    if str(accelerator) in ("gpu", "cuda") and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        return (
            f"trainer.accelerator={accelerator} asks for a CUDA GPU, and none is usable here (torch "
            f"{torch.__version__}, {build}); use PROFILE=cpu, or PROFILE=auto, which picks the gpu "
            "profile only where CUDA is available"
        )
    return None


def parameter_count(arch: dict[str, Any]) -> int:
    """GPT parameters from its config: embeddings (and an untied head) plus 12 C^2 per block, roughly."""
    c, v = arch["n_embd"], arch["vocab_size"]
    head = 0 if arch.get("tie_embeddings", True) else v * c
    return v * c + arch["block_size"] * c + head + arch["n_layer"] * 12 * c * c


def activation_bytes(arch: dict[str, Any], batch_size: int) -> int:
    """A lower bound on one micro-batch's fp32 activations: the logits and their gradient, plus about 16
    values of width C per token and block kept for backward."""
    tokens = batch_size * arch["block_size"]
    return 4 * tokens * (2 * arch["vocab_size"] + 16 * arch["n_layer"] * arch["n_embd"])


def available_memory(cuda: bool) -> int | None:
    """Free bytes on the device training will use (None where it cannot be read)."""
    if cuda:
        if int(os.environ.get("LOCAL_RANK", 0)) > 0:  # rank 0 checked; here it would open a context on GPU 0
            return None
        return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
    try:  # MemAvailable counts the page cache the kernel would give back
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(arch: dict[str, Any], batch_size: int, cuda: bool) -> str | None:
    """A model or batch that cannot fit at all: said before the machine runs out of memory."""
    free = available_memory(cuda)
    params = parameter_count(arch)
    need = params * BYTES_PER_PARAM + activation_bytes(arch, batch_size)
    if free is None or need <= free:
        return None
    gib = 2**30
    return (
        f"this model and batch need at least {need / gib:.1f} GiB ({params / 1e6:.1f}M parameters x "
        f"{BYTES_PER_PARAM} bytes for weights, gradients and AdamW state, plus the activations of "
        f"data.batch_size={batch_size} windows of {arch['block_size']} tokens), and only {free / gib:.1f} GiB is "
        f"free on the {'GPU' if cuda else 'machine'}; check model.arch (vocab_size={arch['vocab_size']}, "
        f"n_embd={arch['n_embd']}, n_layer={arch['n_layer']}) and data.batch_size"
    )

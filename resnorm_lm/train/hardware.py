"""The machine, as the probes that choose a run's kernels see it: the CPU's features, timing on one thread, and a
measurement kept per machine in ``$RESNORM_LM_CACHE`` (``precision.py``'s bf16 probe, ``cpu_attention.py``'s
attention kernels)."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict
from pathlib import Path

import torch

from resnorm_lm.data.cache import build_lock, write_json_atomic


def cpu_features() -> dict:
    """This CPU's model name, architecture and instruction-set flags: /proc/cpuinfo, else torch's cpuinfo (macOS)."""
    try:
        first_cpu = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        get_capabilities = getattr(torch.cpu, "get_capabilities", None)  # torch >= 2.9
        if get_capabilities is not None:
            return dict(get_capabilities())
        return {"architecture": platform.machine(), "cpu_name": platform.processor() or platform.machine()}
    fields = {
        key.strip(): value.strip()
        for key, value in (line.split(":", 1) for line in first_cpu.splitlines() if ":" in line)
    }
    flags = fields.get("flags", fields.get("Features", "")).split()  # x86 says flags, Arm says Features
    return {
        "architecture": platform.machine(),
        "cpu_name": fields.get("model name", platform.machine()),
        **dict.fromkeys(flags, True),
    }


def is_x86(features: dict) -> bool:
    return str(features.get("architecture", "")).lower() in ("x86_64", "amd64", "x86", "i386", "i686")


def native_bf16_flags(features: dict) -> list[str]:
    """The flags of native bf16 arithmetic this CPU has (none: bf16 is emulated)."""
    names = ("avx512_bf16", "amx_bf16") if is_x86(features) else ("bf16", "sve_bf16")
    return [name for name in names if features.get(name)]


def interleaved_thread_times(steps: dict, pairs: int) -> dict[str, list[float]]:
    """Each of ``steps`` (name -> a call returning its seconds) once to warm up (oneDNN primitives, weight packing,
    first-touch memory), then ``pairs`` rounds of all of them, the order reversed every other round, all on one
    thread so that its CPU time is the whole cost. Returns each step's times, round by round."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step in steps.values():
            step()
        times: dict[str, list[float]] = {name: [] for name in steps}
        for i in range(pairs):
            for name in list(steps)[:: 1 if i % 2 == 0 else -1]:
                times[name].append(steps[name]())
    finally:
        torch.set_num_threads(threads)
    return times


def machine_key() -> dict:
    """What a measurement of this machine depends on: the CPU, its cores, torch (its kernels); a probe adds its
    own version."""
    return {
        "cpu": cpu_features().get("cpu_name") or platform.processor(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
    }


def read_kept(path: Path, key: dict, load):
    """The measurement kept at ``path`` for this machine; None when absent, unreadable or for another machine."""
    try:
        data = json.loads(path.read_text())
        return load(data["probe"]) if data["machine"] == key else None
    except (OSError, ValueError, KeyError, TypeError):  # absent, torn by hand or foreign: measure again
        return None


def kept_per_machine(path: Path, key: dict, measure_now, load, again: str, measure: bool = False):
    """A measurement of this machine kept at ``path`` for ``key``, or taken now by ``measure_now()`` (a dataclass)
    and kept; ``load`` rebuilds it from its dict. Returns it and a phrase saying where it came from.

    A lock makes concurrent first runs (DDP ranks, parallel sweeps) measure once and share the result.
    """
    result = None
    try:
        with build_lock(path):
            kept = None if measure else read_kept(path, key, load)
            if kept is not None:
                return kept, f"measured {kept.measured}, read from {path}; `{again}` measures again"
            result = measure_now()
            write_json_atomic(path, {"machine": key, "probe": asdict(result)})
            return result, f"measured now, kept in {path}"
    except OSError as err:  # a cache that cannot be written: measure in every run (once), and say why
        return result or measure_now(), f"measured now, not kept: {err}"

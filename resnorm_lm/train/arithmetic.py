"""The arithmetic a run computes with: what sets it, a fingerprint that shows it, and the portable setting.

The same code and seed give bit-different runs on different machines: kernels dispatched to AVX-512 or AVX2,
the math libraries' code paths (MKL, oneDNN), the number of threads (a reduction's order), the CPU attention
kernel, TF32 on a GPU, the torch version. Two runs belong in one table only when their arithmetic is the same,
and that is shown, not assumed: every run records a **fingerprint**, hashes of the exact numbers of two fixed
short trainings run at its start, in its own process, on its own device and precision:

* ``reference``: a fixed 2-block pre-norm model at the run's width, heads, vocabulary, context and batch. It
  depends on the machine, the environment and torch, not on the recipe: runs of one table must share it.
* ``model``: the run's own architecture. It changes when the code changes a number of that recipe; a refactor
  that changes no number keeps it, so it does not split a table.

Each is three steps of AdamW with the gradient clipped at 1.0, on random tokens from a fixed seed; what is hashed
is every loss (fp32 bits) and every parameter after the last step, as an order-free set of tensor digests (a
renamed or reordered parameter changes nothing). The run's own RNG streams are left as they were.

The **portable** arithmetic (``PORTABLE_ENV``, set by ``make suite`` for every run it trains) caps the kernels at
AVX2 (torch's dispatch, oneDNN, MKL and its reproducible mode), runs one thread, fixes the CPU attention kernel
and turns TF32 off on a GPU, so that CPUs of different kinds can compute the same numbers: whether they do is
what the fingerprint then says. The caps are read when the libraries load, so they must be in the environment
before the process starts.
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Any

import torch

from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.train.cpu_attention import ATTENTION_ENV
from resnorm_lm.train.optim import OptimConfig, build_optimizer
from resnorm_lm.train.precision import TF32_ENV, set_matmul_precision_for

FINGERPRINT_VERSION = 1  # bump when the probe changes: fingerprints of different versions never match
PROBE_STEPS = 3
PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's own vectorized kernels
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (in fp32 here its GELU; bf16 matmuls; fp32 matmuls are MKL's)
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # MKL's code path
    "MKL_CBWR": "AVX2",  # MKL's conditional numerical reproducibility: the AVX2 branch on every CPU
    "OMP_NUM_THREADS": "1",  # one thread: a reduction's order does not depend on the core count
    "MKL_NUM_THREADS": "1",
    ATTENTION_ENV: "flash",  # the faster in fp32 where measured (tests/test_cpu_attention.py: both exact)
    TF32_ENV: "off",
}
RECORDED_ENV = sorted(PORTABLE_ENV)  # the variables a run's record keeps, set or not


def environment() -> dict[str, str]:
    """The arithmetic variables set in this process's environment."""
    return {name: os.environ[name] for name in RECORDED_ENV if name in os.environ}


def is_portable(env: dict[str, str]) -> bool:
    return all(env.get(name) == value for name, value in PORTABLE_ENV.items())


def describe(device: torch.device, precision: str) -> dict[str, Any]:
    """What sets this process's arithmetic, for the run's manifest."""
    info: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": precision,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "env": environment(),
    }
    if device.type == "cuda":
        info["tf32"] = torch.backends.cuda.matmul.allow_tf32
    info["portable"] = is_portable(info["env"])
    return info


def fingerprint(arch: GPTConfig, batch_size: int, device: torch.device, precision: str) -> dict[str, Any]:
    """The run's fingerprint: ``reference`` and ``model`` digests (see the module's docstring) and the version."""
    reference = GPTConfig(
        vocab_size=arch.vocab_size, block_size=arch.block_size, n_layer=2, n_head=arch.n_head, n_embd=arch.n_embd
    )
    return {
        "version": FINGERPRINT_VERSION,
        "reference": probe_digest(reference, batch_size, device, precision),
        "model": probe_digest(arch, batch_size, device, precision),
    }


def probe_digest(arch: GPTConfig, batch_size: int, device: torch.device, precision: str) -> str:
    """Train ``arch`` for ``PROBE_STEPS`` steps on fixed random tokens; a digest of its losses and weights."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        model = GPT(arch).to(device)
        dtype = {"64-true": torch.float64, "bf16-true": torch.bfloat16, "16-true": torch.float16}.get(precision)
        if dtype is not None:
            model = model.to(dtype)
        autocast = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
        optimizer, schedule = build_optimizer(
            model, OptimConfig(lr=1e-3, schedule="constant", warmup_fraction=0.0), PROBE_STEPS
        )
        tokens = torch.Generator().manual_seed(0)
        digest = hashlib.sha256()
        for _ in range(PROBE_STEPS):
            batch = torch.randint(arch.vocab_size, (batch_size, arch.block_size + 1), generator=tokens).to(device)
            with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
                _, loss = model(batch[:, :-1], batch[:, 1:])  # (B, T) inputs and targets
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
            digest.update(struct.pack("<f", loss.item()))
        weights = (p.detach().float().cpu().numpy().tobytes() for p in model.parameters())
        for tensor in sorted(hashlib.sha256(w).digest() for w in weights):  # in no particular order of names
            digest.update(tensor)
    return digest.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    """``python -m resnorm_lm.train.arithmetic [--profile cpu] [--portable] [--device cuda] [--recipes R ...]
    [--json]``: this machine's fingerprints at a profile's shapes, in fp32, without training a run: the reference's,
    and with ``--recipes`` each recipe's model fingerprint; on the CPU, or with ``--device cuda`` on the GPU with its
    TF32 setting (``RESNORM_LM_TF32``), as a run with ``--trainer.accelerator=gpu`` records them. Compare them with a
    table's to know whether this machine and this code compute its numbers (``suite --reuse`` does, before it copies
    another suite's runs)."""
    import argparse
    import json
    import sys

    import yaml

    from resnorm_lm.train.cpu_attention import use_for_run
    from resnorm_lm.train.recipes import RECIPES_DIR, recipe_arch, resolve_profile

    parser = argparse.ArgumentParser(prog="python -m resnorm_lm.train.arithmetic", description=main.__doc__)
    parser.add_argument("--profile", default="cpu", help="whose width, heads, vocabulary, context and batch")
    parser.add_argument("--portable", action="store_true", help="in the portable arithmetic (the suites')")
    parser.add_argument("--recipes", nargs="*", default=[], help="recipes whose model fingerprints to print too")
    parser.add_argument("--json", action="store_true", help="one JSON object: reference, models, version")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the runs compute (cpu)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA GPU (torch.cuda.is_available() is False)")
    if args.portable and not is_portable(environment()):  # the caps are read when the libraries load: start again
        os.execve(
            sys.executable,
            [sys.executable, "-m", "resnorm_lm.train.arithmetic", *sys.argv[1:]],
            {**os.environ, **PORTABLE_ENV},
        )
    config = yaml.safe_load((RECIPES_DIR / "profiles" / f"{resolve_profile(args.profile)}.yaml").read_text())
    arch, data = config["model"]["arch"], config["data"]
    reference = GPTConfig(
        vocab_size=data["vocab_size"],
        block_size=data["block_size"],
        n_layer=2,
        n_head=arch["n_head"],
        n_embd=arch["n_embd"],
    )
    use_for_run("32-true", data["batch_size"], arch["n_head"], data["block_size"], arch["n_embd"])  # as a fit does
    device = torch.device(args.device)
    set_matmul_precision_for(device.type == "cuda")  # as a fit's Trainer does: TF32 or full fp32 on a GPU
    record = describe(device, "32-true")
    digest = probe_digest(reference, data["batch_size"], device, "32-true")
    models = {
        r: probe_digest(recipe_arch(r, args.profile), data["batch_size"], device, "32-true") for r in args.recipes
    }
    if args.json:
        print(json.dumps({"version": FINGERPRINT_VERSION, "reference": digest, "models": models}))
        return 0
    print(
        f"reference fingerprint at the {args.profile} profile, fp32 on {record['device']}: {digest} "
        f"(v{FINGERPRINT_VERSION}); "
        f"cpu_capability {record['cpu_capability']}, {record['threads']} thread(s), portable {record['portable']}"
    )
    for recipe, model in models.items():
        print(f"model fingerprint of {recipe}: {model} (v{FINGERPRINT_VERSION})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

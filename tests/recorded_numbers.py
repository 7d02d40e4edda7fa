"""What the model computes, recorded so that a change that should change no number can show that it did not.

For every placement (and every recipe's architecture at the smoke profile's shapes) this records, with the code of
the commit that wrote it:

- ``checkpoints/<placement>.pt``: a tiny model's weights (``state_dict``, read with ``weights_only=True``), a batch of
  token ids and the logits it gave: a refactor must load the weights and give the same logits;
- ``fingerprints.json``: each recipe's model fingerprint (``resnorm_lm.train.arithmetic``: three training steps'
  losses and weights, bit for bit), by the reference fingerprint of the machine and environment that computed
  them. Bit-level numbers depend on the arithmetic (an AMD EPYC and an Intel Xeon differ, and the Xeon's AVX-512
  kernels from its AVX2-capped ones), so each arithmetic has its own record, compared only where the reference
  fingerprint is the same (the test says so and skips on a machine none was recorded on).

    python -m tests.recorded_numbers               # record again: a change meant to change the numbers (every
                                                   # other arithmetic's record is dropped: it holds the old ones)
    python -m tests.recorded_numbers --add-machine # this arithmetic's record beside the others, or a new recipe's
                                                   # numbers in it (and a new placement's checkpoint), where the
                                                   # code changed no recorded number
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # as in the tests (tests/conftest.py), before torch loads
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from resnorm_lm.model.gpt import GPT, GPTConfig  # noqa: E402
from resnorm_lm.model.placements import PLACEMENTS  # noqa: E402
from resnorm_lm.train.arithmetic import fingerprint  # noqa: E402
from resnorm_lm.train.recipes import available_recipes, recipe_arch  # noqa: E402

HERE = Path(__file__).resolve().parent / "fixtures" / "numbers"
TINY = {"vocab_size": 61, "block_size": 12, "n_layer": 4, "n_head": 2, "n_embd": 16}
BATCH = 3


def tiny_model(placement: str) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**TINY, placement=placement))


def tokens() -> torch.Tensor:
    return torch.randint(TINY["vocab_size"], (BATCH, TINY["block_size"]), generator=torch.Generator().manual_seed(1))


def record(add_machine: bool = False) -> None:
    """This machine's fingerprints into ``fingerprints.json``: beside the other arithmetics' (``add_machine``, which
    writes only the checkpoints of placements that have none), or alone with new checkpoints (a change meant to
    change the numbers)."""
    (HERE / "checkpoints").mkdir(parents=True, exist_ok=True)
    for placement in PLACEMENTS.names():
        path = HERE / "checkpoints" / f"{placement}.pt"
        if add_machine and path.exists():
            continue  # kept: what the code computed when it was recorded; only a new placement's is written
        model = tiny_model(placement)
        ids = tokens()
        with torch.no_grad():
            logits, _ = model(ids)
        torch.save({"state_dict": model.state_dict(), "ids": ids, "logits": logits}, path)
    cpu = torch.device("cpu")
    prints = {r: fingerprint(recipe_arch(r, "smoke"), 4, cpu, "32-true") for r in available_recipes()}
    references = {p["reference"] for p in prints.values()}
    assert len(references) == 1, references  # one machine, one environment: one reference
    reference = references.pop()
    machines = recorded_machines() if add_machine else {}
    for other in machines.values():  # a recipe removed since leaves every record
        other["models"] = {r: m for r, m in other["models"].items() if r in prints}
    dropped = sorted(set(recorded_machines()) - set(machines) - {reference})
    machines[reference] = {
        "cpu": cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "models": {r: p["model"] for r, p in sorted(prints.items())},
    }
    (HERE / "fingerprints.json").write_text(json.dumps({"machines": machines}, indent=1, sort_keys=True) + "\n")
    done = f"{len(prints)} fingerprints of arithmetic {reference} in {HERE}"
    print(f"recorded {done}" if add_machine else f"recorded {len(PLACEMENTS.names())} checkpoints and {done}")
    if dropped:
        print(f"dropped the records of {', '.join(dropped)}: their numbers are the old code's")


def recorded_machines() -> dict[str, dict]:
    """The recorded fingerprints, by the reference fingerprint of the arithmetic that computed them."""
    path = HERE / "fingerprints.json"
    return json.loads(path.read_text())["machines"] if path.exists() else {}


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's where there is none."""
    import platform

    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.recorded_numbers", description=__doc__)
    parser.add_argument(
        "--add-machine",
        action="store_true",
        help="record this arithmetic beside the others (the code changed no recorded number)",
    )
    record(parser.parse_args().add_machine)

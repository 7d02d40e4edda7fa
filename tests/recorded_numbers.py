"""What the model computes, recorded so that a change that should change no number can show that it did not.

For every placement (and every recipe's architecture at the smoke profile's shapes) this records, with the code of
the commit that wrote it:

- ``checkpoints/<placement>.pt``: a tiny model's weights (``state_dict``, read with ``weights_only=True``), a batch of
  token ids and the logits it gave: a refactor must load the weights and give the same logits;
- ``fingerprints.json``: each recipe's model fingerprint (``resnorm_lm.train.arithmetic``: three training steps'
  losses and weights, bit for bit) and the reference fingerprint of the machine and environment that recorded them.
  Bit-level numbers depend on the arithmetic, so they are compared only where the reference fingerprint is the
  same (the test says so and skips elsewhere).

    python -m tests.recorded_numbers      # record again (only when a change is meant to change the numbers)
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


def record() -> None:
    (HERE / "checkpoints").mkdir(parents=True, exist_ok=True)
    for placement in PLACEMENTS.names():
        model = tiny_model(placement)
        ids = tokens()
        with torch.no_grad():
            logits, _ = model(ids)
        torch.save(
            {"state_dict": model.state_dict(), "ids": ids, "logits": logits}, HERE / "checkpoints" / f"{placement}.pt"
        )
    cpu = torch.device("cpu")
    prints = {r: fingerprint(recipe_arch(r, "smoke"), 4, cpu, "32-true") for r in available_recipes()}
    references = {p["reference"] for p in prints.values()}
    assert len(references) == 1, references  # one machine, one environment: one reference
    record = {
        "reference": references.pop(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "models": {r: p["model"] for r, p in sorted(prints.items())},
    }
    (HERE / "fingerprints.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"recorded {len(PLACEMENTS.names())} checkpoints and {len(prints)} fingerprints in {HERE}")


if __name__ == "__main__":
    record()

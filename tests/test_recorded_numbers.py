"""The model computes what it computed when ``tests/recorded_numbers.py`` recorded it: every placement's saved
weights load and give their logits, and every recipe's fingerprint (three training steps, bit for bit) is the same
where the arithmetic is the same. A change meant to change no number (a refactor) must pass both."""

from __future__ import annotations

import pytest
import torch

from resnorm_lm.model.placements import PLACEMENTS
from resnorm_lm.train.arithmetic import fingerprint
from resnorm_lm.train.recipes import available_recipes, recipe_arch
from tests.recorded_numbers import GPT, HERE, TINY, GPTConfig, recorded_machines

RECORDED = recorded_machines()  # reference fingerprint -> {cpu, cpu_capability, models}


@pytest.mark.parametrize("placement", PLACEMENTS.names())
def test_a_saved_model_of_every_placement_loads_and_gives_its_logits(placement):
    saved = torch.load(HERE / "checkpoints" / f"{placement}.pt", weights_only=True)
    model = GPT(GPTConfig(**TINY, placement=placement))
    model.load_state_dict(saved["state_dict"])  # strict: every key, no key left over
    with torch.no_grad():
        logits, _ = model(saved["ids"])
    # the same arithmetic gives the same bits; another CPU kind's kernels round differently (~1e-7 relative)
    torch.testing.assert_close(logits, saved["logits"], rtol=1e-5, atol=1e-6)


def test_every_recipe_was_recorded():
    # a recipe added or removed: python -m tests.recorded_numbers --add-machine (it leaves the other records too)
    assert RECORDED, "no fingerprints recorded: python -m tests.recorded_numbers"
    assert set().union(*(m["models"] for m in RECORDED.values())) == set(available_recipes())
    for reference, machine in RECORDED.items():
        assert set(machine["models"]) <= set(available_recipes()), f"{reference} holds a recipe that is gone"


def test_every_recipes_first_steps_are_bit_identical_to_the_recorded_ones():
    cpu = torch.device("cpu")
    here = fingerprint(recipe_arch("prenorm-12l", "smoke"), 4, cpu, "32-true")["reference"]
    if here not in RECORDED:
        recorded = "; ".join(f"{r} ({m['cpu']}, {m['cpu_capability']} kernels)" for r, m in sorted(RECORDED.items()))
        pytest.skip(
            f"this machine's arithmetic (reference fingerprint {here}) is none of those the numbers were recorded "
            f"with ({recorded}): bits differ. Record it where the code changed no number: "
            "python -m tests.recorded_numbers --add-machine"
        )
    models = RECORDED[here]["models"]
    changed = {
        r: (models[r], p)
        for r in sorted(models)
        if (p := fingerprint(recipe_arch(r, "smoke"), 4, cpu, "32-true")["model"]) != models[r]
    }
    assert not changed, f"recipes whose numbers changed (recorded, now): {changed}"

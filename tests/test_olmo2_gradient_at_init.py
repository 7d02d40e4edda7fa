"""scripts/olmo2_gradient_at_init.py: each parameter's kind, and the row that splits the global norm by kind."""

from __future__ import annotations

import math

import pytest

from tests.scripts import load_script

ARCH = {"n_layer": 2, "n_head": 2, "n_embd": 32, "placement": "olmo2", "norm": "rmsnorm", "qk_norm": "full"}


@pytest.fixture(scope="module")
def probe():
    return load_script("olmo2_gradient_at_init")


def test_every_parameter_has_one_kind_and_the_kinds_make_the_global_norm(probe):
    grads = probe.gradients_at_init(ARCH, seed=1, batch=2, vocab=64, length=8)
    kinds = {k for k, _ in grads.values()}
    assert kinds == set(probe.KINDS)
    assert grads["stream.blocks.0.attn.c_proj.bias"][0] == "Linear biases"
    assert grads["stream.blocks.0.attn.c_proj.weight"][0] == "weight matrices"
    assert [k for n, (k, _) in grads.items() if "wte" in n or "wpe" in n] == ["embeddings", "embeddings"]
    row = probe.summarize("arm", grads, top=2)
    parts = [float(row[k]) for k in probe.KINDS]
    assert row["global"] == f"{math.sqrt(sum(g * g for _, g in grads.values())):.3g}"
    assert float(row["global"]) == pytest.approx(math.sqrt(sum(p * p for p in parts)), rel=1e-2)  # 3 digits each
    largest = max(grads.items(), key=lambda kv: kv[1][1])
    assert row["largest"].startswith(f"`{largest[0]}`")


def test_an_arm_without_biases_shows_none(probe):
    grads = probe.gradients_at_init({**ARCH, "bias": False}, seed=1, batch=2, vocab=64, length=8)
    assert probe.summarize("arm", grads, top=1)["Linear biases"] == "-"

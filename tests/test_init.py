"""Inits by name (resnorm_lm/model/init.py): the std of every weight after init, per rule, and the placements'
own rules on top of each."""

from __future__ import annotations

import math

import pytest
import torch

from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.init import INITS
from resnorm_lm.model.placements import DeepNorm

C, N = 128, 4  # width: weights of 16k to 64k entries, so a sample std is within about 1% of its expectation


def model(init: str, placement: str = "prenorm", **extra) -> GPT:
    torch.manual_seed(0)
    return GPT(
        GPTConfig(vocab_size=256, block_size=32, n_layer=N, n_head=4, n_embd=C, init=init, placement=placement, **extra)
    )


def stds(m: GPT) -> dict[str, float]:
    """The std of each kind of weight, pooled over the blocks."""
    blocks = m.blocks
    q, k, v = zip(*(b.attn.c_attn.weight.split(C) for b in blocks))
    kinds = {
        "q": q,
        "k": k,
        "v": v,
        "attn_out": [b.attn.c_proj.weight for b in blocks],
        "mlp_in": [b.mlp.c_fc.weight for b in blocks],
        "mlp_out": [b.mlp.c_proj.weight for b in blocks],
        "wte": [m.wte.weight],
        "wpe": [m.wpe.weight],
        "head": [m.lm_head.weight],
    }
    return {kind: torch.cat([w.detach().flatten() for w in ws]).std().item() for kind, ws in kinds.items()}


def uniform_std(bound: float) -> float:
    return bound / math.sqrt(3)


XAVIER_QKV = uniform_std(math.sqrt(6 / (2 * C)) / math.sqrt(2))  # gain 1/sqrt(2), fan_in = fan_out = C
XAVIER_OUT = uniform_std(math.sqrt(6 / (2 * C)))
DEFAULT_LINEAR = {"mlp_in": uniform_std(1 / math.sqrt(C)), "mlp_out": uniform_std(1 / math.sqrt(4 * C))}
EMBED = C**-0.5
EXPECTED = {
    "gpt2": {
        "q": 0.02,
        "k": 0.02,
        "v": 0.02,
        "attn_out": 0.02 / math.sqrt(2 * N),
        "mlp_in": 0.02,
        "mlp_out": 0.02 / math.sqrt(2 * N),
        "wte": 0.02,
        "wpe": 0.02,
        "head": 0.02,
    },
    "plain": {
        "q": 0.02,
        "k": 0.02,
        "v": 0.02,
        "attn_out": 0.02,
        "mlp_in": 0.02,
        "mlp_out": 0.02,
        "wte": 0.02,
        "wpe": 0.02,
        "head": 0.02,
    },
    "xavier": {
        "q": XAVIER_QKV,
        "k": XAVIER_QKV,
        "v": XAVIER_QKV,
        "attn_out": XAVIER_OUT,
        **DEFAULT_LINEAR,
        "wte": EMBED,
        "wpe": EMBED,
        "head": EMBED,
    },
}
EXPECTED["xavier_rescaled"] = {
    kind: std * (N**-0.5 if kind not in ("wte", "wpe", "head") else 1.0) for kind, std in EXPECTED["xavier"].items()
}


def test_every_registered_init_has_its_expected_stds():
    assert set(INITS.names()) == set(EXPECTED)


@pytest.mark.parametrize("init", sorted(EXPECTED))
def test_each_weight_has_the_std_its_rule_gives(init):
    measured = stds(model(init))
    for kind, expected in EXPECTED[init].items():
        assert measured[kind] == pytest.approx(expected, rel=0.05), f"{init} {kind}: {measured[kind]:.5f}"


@pytest.mark.parametrize("init", ["gpt2", "xavier"])
def test_an_untied_head_follows_the_init(init):
    head = model(init, tie_embeddings=False).lm_head.weight.std().item()
    assert head == pytest.approx(EXPECTED[init]["head"], rel=0.05)


def test_biases_are_zero_under_gpt2_and_xavier_keeps_torchscales():
    gpt2, xavier = model("gpt2"), model("xavier")
    assert all(torch.all(p == 0) for name, p in gpt2.named_parameters() if name.endswith("bias") and "norm" not in name)
    block = xavier.blocks[0]
    assert torch.all(block.attn.c_proj.bias == 0)  # torchscale zeroes the attention output's bias
    assert block.mlp.c_fc.bias.abs().max() > 0 and block.attn.c_attn.bias.abs().max() > 0  # PyTorch's default


@pytest.mark.parametrize("init", ["gpt2", "xavier"])
def test_deepnorm_divides_whatever_the_init_set_by_its_beta(init):
    """DeepNorm's own rule replaces the init's depth rule: v, the attention output and the MLP's weights (and
    biases) times beta = (8N)^(-1/4), the rest as the init set them (torchscale divides its Xavier init)."""
    beta = DeepNorm.init_scale(N)
    measured = stds(model(init, placement="deepnorm"))
    undivided = {**EXPECTED[init], "attn_out": EXPECTED[init]["q"] if init == "gpt2" else XAVIER_OUT}
    if init == "gpt2":
        undivided["mlp_out"] = 0.02
    for kind, expected in undivided.items():
        scaled = kind in ("v", "attn_out", "mlp_in", "mlp_out")
        assert measured[kind] == pytest.approx(expected * (beta if scaled else 1.0), rel=0.05), kind
    xavier_default = model("xavier", placement="deepnorm").blocks[0].mlp.c_fc.bias.abs().max().item()
    assert xavier_default <= beta / math.sqrt(C) + 1e-7  # a default bias U(+-1/sqrt(C)), divided too


def test_an_unknown_init_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown init 'kaiming'; valid inits: gpt2, plain, xavier, xavier_rescaled"):
        GPTConfig(init="kaiming")


def test_a_run_records_its_init_in_the_manifest(recipe_run):
    import json

    assert json.loads((recipe_run("prenorm-12l-xavier") / "manifest.json").read_text())["init"] == "xavier"

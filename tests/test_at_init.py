"""``resnorm-lm at-init``: per-block gradient norms and stream RMS at initialization, over depths and inits."""

import csv

import pytest
import torch

from resnorm_lm.analysis import block_measurements
from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.train.diagnostics import grad_norms_at_init

SHAPE = {"width": 32, "batch": 2, "length": 16, "vocab": 64}


def test_a_measurement_is_one_backward_pass_of_the_model_at_its_init():
    grads, rms = block_measurements.measure_at_init("prenorm", "xavier", 3, seed=2, **SHAPE)
    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=3, n_head=1, n_embd=32, init="xavier"))
    idx = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(1002))
    assert grads == pytest.approx(grad_norms_at_init(model, idx[:, :-1], idx[:, 1:]), rel=1e-6)
    assert len(rms) == 3 and rms[-1] > rms[0] > 0  # pre-norm's stream grows block by block


def test_the_command_writes_a_row_per_block_a_table_and_two_figures(tmp_path):
    out = tmp_path / "out"
    shape = ["--width", "32", "--batch", "2", "--length", "16", "--vocab", "64", "--out", str(out)]
    argv = [
        "--placements",
        "postnorm",
        "prenorm",
        "--inits",
        "gpt2",
        "xavier",
        "--depths",
        "1",
        "3",
        "--seeds",
        "1",
        "2",
        *shape,
    ]
    assert block_measurements.at_init_main(argv) == 0
    rows = list(csv.DictReader((out / "at_init.csv").open()))
    assert len(rows) == 2 * 2 * (1 + 3)
    post = [r for r in rows if r["placement"] == "postnorm"]
    assert all(float(r["stream_rms"]) == pytest.approx(1.0, rel=1e-3) for r in post)  # a LayerNorm's output
    seeds = [block_measurements.measure_at_init("prenorm", "gpt2", 3, seed, **SHAPE)[0][2] for seed in (1, 2)]
    mine = next(
        r for r in rows if (r["placement"], r["init"], r["n_layer"], r["block"]) == ("prenorm", "gpt2", "3", "2")
    )
    assert float(mine["grad_norm"]) == pytest.approx(sum(seeds) / 2, rel=1e-6)  # the mean over the seeds
    table = (out / "at_init.md").read_text()
    assert table.count("\n| ") == 2 * 2 * 2 + 1 and "| postnorm | xavier | 3 |" in table
    for name in ("at_init_grad_norms.png", "at_init_stream_rms.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")


def test_bad_arguments_are_refused_with_what_was_wrong(capsys):
    with pytest.raises(SystemExit):
        block_measurements.at_init_main(["--depths", "0"])
    assert "depths, width, batch and length must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        block_measurements.at_init_main(["--placements", "layernorm"])
    assert "invalid choice: 'layernorm'" in capsys.readouterr().err


def test_a_placement_whose_blocks_get_no_gradient_at_init_has_no_ratio():
    rows = [
        {"placement": "rezero", "init": "gpt2", "n_layer": 2, "block": b, "grad_norm": 0.0, "stream_rms": 0.02}
        for b in range(2)
    ]
    (row,) = block_measurements.summary(rows)  # ReZero's zero gates: its blocks' matrices get no gradient
    assert row["grad last/first"] == "-" and row["RMS last/first"] == "1.00"

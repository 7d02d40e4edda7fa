"""``resnorm-lm stream-gain``: HC and mHC runs' composite gain per token (the mHC paper's) and from the token-mean
mixes, on a slice of windows and from a run directory (and a clear error for a design without stream mixes)."""

import csv

import pytest
import torch

from resnorm_lm.analysis.sweep import RunSpec, Setting
from resnorm_lm.analysis.token_gain import main, measure
from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.hyper_connections import (
    amax_gain,
    composed,
    recorded_mixes,
    token_composite_gain,
    token_gains_from_each_sublayer,
)
from resnorm_lm.targets import IGNORE_INDEX
from tests.test_depth import DepthTrainer, tiny_run_data


def moved(placement: str) -> GPT:
    """A tiny GPT whose stream mixes are off their init, so its H_res differ from token to token."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=32, placement=placement))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "_hc." in name:
                p.add_(torch.randn_like(p) * 0.5)
    return model.eval()


@pytest.mark.parametrize("placement", ["hc", "mhc"])
def test_the_measurement_counts_each_target_once_across_batches_and_skips_padding(placement):
    model = moved(placement)
    x = torch.randint(0, 64, (5, 8))
    y = torch.randint(0, 64, (5, 8))
    y[4, 5:] = IGNORE_INDEX  # the last window's padding: 37 targets
    got = measure(model, x, y, batch_size=2)  # batches of 2, 2 and 1 windows
    with torch.no_grad(), recorded_mixes(model) as mixes:
        model(x)  # the whole slice at once
    valid = y != IGNORE_INDEX
    gain = token_composite_gain(mixes)
    mean_mix = amax_gain(composed([h[valid].double().mean(0) for h in mixes]))
    assert got.tokens == 37
    assert got.per_token_mean == pytest.approx((gain.forward[valid].mean().item(), gain.backward[valid].mean().item()))
    assert got.per_token_max == pytest.approx((gain.forward[valid].max().item(), gain.backward[valid].max().item()))
    assert got.token_mean_mix == pytest.approx((mean_mix.forward.item(), mean_mix.backward.item()))
    suffixes = token_gains_from_each_sublayer(mixes)
    assert len(got.from_each_sublayer) == 4  # 2 blocks: 4 sublayers
    for l, (f, b) in enumerate(got.from_each_sublayer):
        assert (f, b) == pytest.approx(
            (suffixes[l].forward[valid].mean().item(), suffixes[l].backward[valid].mean().item())
        )
    assert got.from_each_sublayer[0] == pytest.approx(got.per_token_mean)
    peak, at = got.peak(1)
    assert peak == max(b for _, b in got.from_each_sublayer) == got.from_each_sublayer[at][1]
    if placement == "hc":  # random dynamic parts: the two definitions part
        assert got.per_token_mean[0] != pytest.approx(got.token_mean_mix[0], rel=1e-3)
    else:  # rows of doubly stochastic mixes sum to 1, per token and on average
        assert got.per_token_mean[0] == pytest.approx(1.0) and got.token_mean_mix[0] == pytest.approx(1.0)


@pytest.mark.parametrize("recipe", ["hc-12l", "prenorm-12l"])
def test_the_command_reads_a_run_and_refuses_a_design_without_stream_mixes(tmp_path, capsys, recipe):
    data = tiny_run_data(tmp_path)
    spec = RunSpec(recipe, Setting(1e-3, 0.33), 1, depth=2)
    DepthTrainer(tmp_path / "runs", lambda *a: 5.0, data).train_all([spec])  # an untrained checkpoint
    run_dir = spec.run_dir(str(tmp_path / "runs"), "smoke")
    code = main([str(run_dir), "--tokens", "40", "--csv", str(tmp_path / "g.csv")])
    captured = capsys.readouterr()
    if recipe == "prenorm-12l":
        assert code == 2 and "placement (prenorm) has no stream mixes" in captured.err
        assert not (tmp_path / "g.csv").exists()
        return
    # HC at init: A_r = I for every token, so every gain is exactly 1; its metrics.csv logs no gain ("-")
    assert code == 0 and "| 5 | - | 1 / 1 | 1 / 1 | 1 / 1 | 1 / 1 | 1 / 1 (from block 0 attention" in captured.out
    (row,) = list(csv.DictReader((tmp_path / "g.csv").open()))
    assert row["tokens"] == "48" and row["logged_f"] == "" and float(row["per_token_mean_b"]) == 1.0
    assert float(row["peak_f"]) == 1.0 and row["peak_b_from"] == "block 0 attention"


def test_the_logged_column_is_the_last_logged_gain(tmp_path, capsys):
    data = tiny_run_data(tmp_path)
    spec = RunSpec("hc-12l", Setting(1e-3, 0.33), 1, depth=2)
    DepthTrainer(tmp_path / "runs", lambda *a: 5.0, data).train_all([spec])
    run_dir = spec.run_dir(str(tmp_path / "runs"), "smoke")
    (run_dir / "metrics.csv").write_text(
        "step,hc/gain_forward,hc/gain_backward\n0,1.0,1.0\n3,,\n4,12.5,7.25\n"  # a row without it (an eval row)
    )
    assert main([str(run_dir), "--tokens", "16"]) == 0
    assert "| 12.5 / 7.25 |" in capsys.readouterr().out


def test_the_command_says_what_is_wrong(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "stream-gain: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--tokens", "0"])
    assert "--tokens must be positive" in capsys.readouterr().err

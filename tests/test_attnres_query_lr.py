"""scripts/attnres_query_lr.py: AttnRes's depth queries at the LR, slowed and frozen, against its own pre-norm."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from tests.scripts import load_script

COMMITTED = Path(__file__).resolve().parents[1] / "docs" / "results" / "attnres-query-lr"


@pytest.fixture(scope="module")
def probe():
    return load_script("attnres_query_lr")


def test_each_arm_trains_its_recipe_on_the_suites_protocol_with_only_its_query_factor_added(probe, tmp_path):
    suite_args = probe.load(probe.SUITE).train_args()
    for arm, (recipe, _, multipliers) in probe.ARMS.items():
        cmd = probe.fit_command(arm, "0.008", 2, tmp_path, resume=False)
        assert cmd[cmd.index("--recipe") + 1] == recipe and "--seed_everything=2" in cmd
        assert all(arg in cmd for arg in suite_args) and "--model.optim.lr=0.008" in cmd
        options = [arg for arg in cmd if arg.startswith("--model.optim.lr_multipliers")]
        assert options == ([] if multipliers is None else [f"--model.optim.lr_multipliers={json.dumps(multipliers)}"])
        assert probe.fit_command(arm, "0.008", 2, tmp_path, resume=True) == [*cmd, "--ckpt_path=last"]
    roots = {probe.arm_root(tmp_path, arm) for arm in probe.ARMS}
    assert len(roots) == len(probe.ARMS) - 1  # pre-norm and AttnRes share "plain" (different recipes)
    frozen_readout = probe.fit_command("AttnRes, readout query frozen at zero", "0.008", 0, tmp_path, resume=False)
    assert '--model.optim.lr_multipliers={"*readout.query": 0.0}' in frozen_readout
    runs = {probe.arm_run(tmp_path, arm, "0.008", seed) for arm in probe.ARMS for seed in (0, 1)}
    assert len(runs) == 2 * len(probe.ARMS)  # no two arms or seeds write one run directory


def test_the_table_shows_the_finished_arms_against_pre_norm_and_names_the_missing(probe, tmp_path, capsys):
    root = tmp_path / "runs"
    shutil.copytree(COMMITTED, root, ignore=shutil.ignore_patterns("*.md", "*-seed[1-9]"))  # seed 0 only
    frozen = "AttnRes, queries frozen at zero"
    shutil.rmtree(probe.arm_run(root, frozen, "0.008"))
    assert probe.table(root, ["0.008"], [0], None) == 0
    captured = capsys.readouterr()
    assert f"lr 0.008, seed 0: not finished, left out (train first): {frozen}" in captured.err
    assert "| 0.008 | 0 | pre-norm | 5.374 | 5.072 | +0.000 | +0.000 | 0.302 |" in captured.out
    assert "| 0.008 | 0 | AttnRes | 5.344 | 5.129 | -0.030 | +0.057 | 0.215 |" in captured.out
    assert f"| {frozen} |" not in captured.out and "Paired by seed" not in captured.out  # one seed: no interval

    for seed, shift in ((0, 0.0), (1, 0.010)):  # stand-ins: the committed seed-0 files, losses set by hand
        for arm, end in (("pre-norm", 5.070), ("AttnRes", 5.130), (frozen, 5.080)):
            run = probe.arm_run(root, arm, "0.008", seed)
            if seed or arm == frozen:
                shutil.copytree(probe.arm_run(COMMITTED, arm, "0.008", 0), run)
            summary = json.loads((run / "eval.json").read_text())
            (run / "eval.json").write_text(json.dumps({**summary, "val_loss": end + shift * (arm != "pre-norm")}))
    assert probe.table(root, ["0.008"], [0, 1], tmp_path / "export") == 0
    out = capsys.readouterr().out
    assert f"| 0.008 | 0 | {frozen} | 5.422 | 5.080 | +0.048 | +0.010 | 0.342 |" in out
    assert f"| 0.008 | 1 | {frozen} | 5.422 | 5.090 | +0.048 | +0.020 | 0.332 |" in out
    # seeds 0 and 1 pair +0.060 and +0.070 for AttnRes: mean 0.065, t(1) 12.706 x 0.005 = 0.064
    assert "| 0.008 | AttnRes | 2 | +0.065 ± 0.064 |" in out and f"| 0.008 | {frozen} | 2 | +0.015 ± 0.064 |" in out
    assert (tmp_path / "export" / "query0" / "attnres-12l" / "cpu-lr0.008-wf0.25-seed1" / "eval.json").is_file()
    assert "frozen" in (tmp_path / "export" / "attnres-query-lr.md").read_text()


def test_without_pre_norm_there_is_no_table(probe, tmp_path, capsys):
    root = tmp_path / "runs"
    shutil.copytree(COMMITTED / "query0.1", root / "query0.1")
    assert probe.table(root, ["0.008"], [0], None) == 1
    assert "pre-norm" in capsys.readouterr().err


def test_depth_sets_each_arms_update_gradient_and_readout_balance_side_by_side(probe, recipe_run, tmp_path, capsys):
    from resnorm_lm.analysis.depth_balance import at_end, ratio_trace
    from resnorm_lm.train.diagnostics import GRAD_NORMS

    root = tmp_path / "runs"
    frozen = "AttnRes, queries frozen at zero"
    for arm, (recipe, _, _) in probe.ARMS.items():  # 2-step smoke runs stand in for the arms; the frozen one missing
        if arm != frozen:
            shutil.copytree(recipe_run(recipe), probe.arm_run(root, arm, "0.008"))
    assert probe.depth(root, ["0.008"], [0], tmp_path / "export") == 0
    captured = capsys.readouterr()
    assert f"lr 0.008, seed 0, {frozen}: not finished or no last.ckpt here, left out" in captured.err
    rows = {row["arm"]: row for row in csv.DictReader((tmp_path / "export" / "depth.csv").open())}
    assert sorted(rows) == sorted(set(probe.ARMS) - {frozen})
    late = "readout's input from the second half of the blocks"
    assert rows["pre-norm"][late] == "-" and 0.0 <= float(rows["AttnRes"][late]) <= 1.0
    for arm, row in rows.items():
        run = probe.arm_run(root, arm, "0.008")
        measured = json.loads((run / "layer_contribution.json").read_text())["update_rms"]  # cached by the call
        assert row["last / first"] == f"{measured[-1] / measured[0]:.2f}"
        assert row["gradient, last / first, at the end"] == f"{at_end(ratio_trace(run, GRAD_NORMS)):.3f}"
    assert "# AttnRes's probe arms across depth" in (tmp_path / "export" / "depth.md").read_text()


def test_the_readouts_late_share_sums_the_second_half_of_the_blocks_sublayers(probe, monkeypatch):
    from resnorm_lm.analysis.depth_weights import Reader

    sources = ["embeddings"] + [f"block {b} {s}" for b in range(4) for s in ("attention", "MLP")]  # 4 blocks
    shares = [0.2, 0.1, 0.1, 0.05, 0.05, 0.1, 0.1, 0.2, 0.1]  # blocks 2 and 3: 0.1 + 0.1 + 0.2 + 0.1
    other = Reader("block 3 MLP", sources[:-1], [1 / 8] * 8, [1 / 8] * 8)
    readout = Reader("readout", sources, [1 / 9] * 9, shares)
    monkeypatch.setattr(probe, "readers_of", lambda run, tokens: ([other, readout], 500))
    assert probe.readout_share_of_late_blocks(Path("any")) == pytest.approx(0.5)

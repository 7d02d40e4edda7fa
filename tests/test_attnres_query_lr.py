"""scripts/attnres_query_lr.py: AttnRes's depth queries at the LR, slowed and frozen, against its own pre-norm."""

from __future__ import annotations

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
    for arm, (recipe, factor) in probe.ARMS.items():
        cmd = probe.fit_command(arm, "0.008", tmp_path, resume=False)
        assert cmd[cmd.index("--recipe") + 1] == recipe
        assert all(arg in cmd for arg in suite_args) and "--model.optim.lr=0.008" in cmd
        options = [arg for arg in cmd if arg.startswith("--model.optim.lr_multipliers")]
        assert options == ([] if factor is None else [f'--model.optim.lr_multipliers={{"*.query": {factor}}}'])
        assert probe.fit_command(arm, "0.008", tmp_path, resume=True) == [*cmd, "--ckpt_path=last"]
    roots = {probe.arm_root(tmp_path, arm) for arm in probe.ARMS}
    assert len(roots) == 3  # pre-norm and AttnRes share "plain" (different recipes); each factor its own root
    runs = {probe.arm_run(tmp_path, arm, "0.008") for arm in probe.ARMS}
    assert len(runs) == len(probe.ARMS)  # no two arms write one run directory


def test_the_table_shows_the_finished_arms_against_pre_norm_and_names_the_missing(probe, tmp_path, capsys):
    root = tmp_path / "runs"
    shutil.copytree(COMMITTED, root, ignore=shutil.ignore_patterns("*.md"))
    assert probe.table(root, ["0.008"], None) == 0
    captured = capsys.readouterr()
    assert "not finished, left out (train first): AttnRes, queries frozen at zero" in captured.err
    assert "| 0.008 | pre-norm | 5.374 | 5.072 | +0.000 | +0.000 | 0.302 |" in captured.out
    assert "| 0.008 | AttnRes | 5.344 | 5.129 | -0.030 | +0.057 | 0.215 |" in captured.out
    assert "frozen" not in captured.out

    frozen = probe.arm_run(root, "AttnRes, queries frozen at zero", "0.008")  # a stand-in: AttnRes's files, 5.080
    shutil.copytree(probe.arm_run(root, "AttnRes", "0.008"), frozen)
    summary = json.loads((frozen / "eval.json").read_text())
    (frozen / "eval.json").write_text(json.dumps({**summary, "val_loss": 5.080}))
    assert probe.table(root, ["0.008"], tmp_path / "export") == 0
    out = capsys.readouterr().out
    assert "| 0.008 | AttnRes, queries frozen at zero | 5.344 | 5.080 | -0.030 | +0.008 | 0.264 |" in out
    assert (tmp_path / "export" / "query0" / "attnres-12l" / "cpu-lr0.008-wf0.25-seed0" / "eval.json").is_file()
    assert "frozen" in (tmp_path / "export" / "attnres-query-lr.md").read_text()


def test_without_pre_norm_there_is_no_table(probe, tmp_path, capsys):
    root = tmp_path / "runs"
    shutil.copytree(COMMITTED / "query0.1", root / "query0.1")
    assert probe.table(root, ["0.008"], None) == 1
    assert "pre-norm" in capsys.readouterr().err

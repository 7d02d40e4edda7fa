"""scripts/qk_attention_logits.py: pre-norm's seed-0 runs with and without QK-norm trained again from their committed
configs, measured at their final weights, and the table that says whether each loss is the committed one."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from resnorm_lm.analysis.attention_logits import BlockLogits
from tests.scripts import load_script


@pytest.fixture(scope="module")
def probe():
    return load_script("qk_attention_logits")


def test_each_setting_has_its_committed_seed0_config(probe):
    for recipe in probe.RECIPES:
        for lr, warmup in probe.SETTINGS:
            assert (probe.committed_run(recipe, lr, warmup) / "config.yaml").is_file(), (recipe, lr, warmup)


def test_the_fit_command_is_the_committed_config_written_elsewhere(probe, tmp_path):
    cmd = probe.fit_command("prenorm-12l", "0.016", "0.25", tmp_path, resume=False)
    config = probe.committed_run("prenorm-12l", "0.016", "0.25") / "config.yaml"
    assert cmd[cmd.index("--config") + 1] == str(config)
    assert f"--run.root={tmp_path}" in cmd and "--run.tag=lr0.016-wf0.25" in cmd
    assert not any(a.startswith(("--seed", "--data.seed", "--model.")) for a in cmd)  # nothing else changed
    assert cmd[-1] == "--ckpt_path=null"  # a config saved by a resumed segment names the checkpoint it resumed from
    assert probe.fit_command("prenorm-12l", "0.016", "0.25", tmp_path, resume=True) == [*cmd[:-1], "--ckpt_path=last"]


def finished_copy(probe, recipe: str, lr: str, warmup: str, root: Path, val_loss: float | None = None) -> Path:
    """The committed run's files under ``root`` with a checkpoint (its bytes are never read: the measurement is
    patched) and, given ``val_loss``, another loss."""
    run = probe.probe_run(recipe, lr, warmup, root)
    shutil.copytree(probe.committed_run(recipe, lr, warmup), run)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    if val_loss is not None:
        summary = json.loads((run / "eval.json").read_text())
        (run / "eval.json").write_text(json.dumps({**summary, "val_loss": val_loss}))
    return run


def test_train_trains_only_what_no_root_has(probe, tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "SETTINGS", [("0.004", "0.25"), ("0.016", "0.25")])
    monkeypatch.setattr(probe, "RECIPES", {r: probe.RECIPES[r] for r in ("prenorm-12l", "prenorm-12l-qknorm")})
    suite_root = tmp_path / "suite"
    finished_copy(probe, "prenorm-12l-qknorm", "0.016", "0.25", suite_root)
    handed = {}
    monkeypatch.setattr(probe, "train_probe_runs", lambda runs, env, jobs, who: handed.update(runs=runs, env=env) or 0)
    root = tmp_path / "runs"
    assert probe.train(root, [suite_root], jobs=1) == 0
    wanted = [("prenorm-12l", "0.004"), ("prenorm-12l", "0.016"), ("prenorm-12l-qknorm", "0.004")]
    assert [path for path, _ in handed["runs"]] == [probe.probe_run(r, lr, "0.25", root) for r, lr in wanted]
    assert all(handed["env"][name] == value for name, value in probe.PORTABLE_ENV.items())


def test_the_table_measures_each_run_and_checks_its_loss_against_the_committed_one(
    probe, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(probe, "SETTINGS", [("0.016", "0.25"), ("0.004", "0.25")])
    monkeypatch.setattr(probe, "RECIPES", {r: probe.RECIPES[r] for r in ("prenorm-12l", "prenorm-12l-qknorm")})
    root, suite_root = tmp_path / "runs", tmp_path / "suite"
    finished_copy(probe, "prenorm-12l", "0.016", "0.25", root)  # the same loss as committed
    finished_copy(probe, "prenorm-12l", "0.004", "0.25", root, val_loss=9.0)  # another arithmetic's
    finished_copy(probe, "prenorm-12l-qknorm", "0.016", "0.25", suite_root)

    def fake_logits(run, tokens):
        big = "qknorm" not in str(run)
        caps = (math.inf, math.inf) if big else (30.0, 20.0)  # QK-norm's: its largest 26/30 and 15/20 of them
        blocks = [
            BlockLogits(1500.0 if big else 26.0, [0.04, 0.9], caps[0]),
            BlockLogits(700.0 if big else 15.0, [0.5, 0.7], caps[1]),
        ]
        return blocks, 500, "none" if big else "full"

    monkeypatch.setattr(probe, "run_logits", fake_logits)
    assert probe.table(root, [suite_root], tmp_path / "export") == 0
    out = capsys.readouterr().out
    assert "| `prenorm-12l` | none | 0.016 | 0.25 | 5.383 | yes | 1.5e+03 (0) | 1.1e+03 | 0.54 | 0.040 (0) | - |" in out
    assert "| `prenorm-12l` | none | 0.004 | 0.25 | 9.000 | no |" in out
    assert "| `prenorm-12l-qknorm` | full | 0.016 | 0.25 |" in out and "| 26 (0) | 20.5 |" in out
    assert "| 0.54 | 0.040 (0) | 0.81 |" in out  # the median of 26/30 and 15/20
    assert "prenorm-12l-qknorm at 0.004/0.25: no finished run with a checkpoint yet" in out
    exported = tmp_path / "export"
    assert (exported / "run-files/prenorm-12l" / probe.run_name("0.016", "0.25") / "eval.json").is_file()
    assert not (exported / "run-files/prenorm-12l-qknorm").exists()  # the suite's runs are committed with it
    assert not list(exported.rglob("*.ckpt"))
    lines = (exported / "blocks.csv").read_text().splitlines()
    assert lines[0] == "recipe,lr,warmup,block,max_abs_logit,cap,entropy_head_0,entropy_head_1" and len(lines) == 7
    assert [line.split(",")[5] for line in lines[1:]] == ["", "", "", "", "30.0", "20.0"]
    assert "| `prenorm-12l` | none | 0.016 |" in (exported / "qk-logits.md").read_text()

"""scripts/attention_logit_growth.py: a few suite runs trained again from their committed configs, their logged
attention logits read over training, and the table that says whether each loss is the committed one."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from tests.scripts import load_script


@pytest.fixture(scope="module")
def probe():
    return load_script("attention_logit_growth")


def test_each_probe_has_its_committed_config(probe):
    assert probe.PROBES
    for run in probe.PROBES:
        config = run.committed / "config.yaml"
        assert config.is_file(), run
        assert f"seed_everything: {run.seed}" in config.read_text(), run  # the seed the run's name says


def test_train_hands_every_probe_its_committed_config_in_the_portable_arithmetic(probe, tmp_path, monkeypatch):
    handed = {}
    monkeypatch.setattr(probe, "train_probe_runs", lambda runs, env, jobs, who: handed.update(runs=runs, env=env) or 0)
    assert probe.train(tmp_path, jobs=1) == 0
    assert [path for path, _ in handed["runs"]] == [p.run(tmp_path) for p in probe.PROBES]
    assert all(handed["env"][name] == value for name, value in probe.PORTABLE_ENV.items())
    first = probe.PROBES[0]
    cmd = handed["runs"][0][1](False)
    assert cmd[cmd.index("--config") + 1] == str(first.committed / "config.yaml")
    assert f"--run.root={tmp_path}" in cmd and f"--run.tag=lr{first.lr}-wf{first.warmup}" in cmd
    assert not any(a.startswith(("--seed", "--data.seed", "--model.")) for a in cmd)  # nothing else changed
    assert cmd[-1] == "--ckpt_path=null"  # a config saved by a resumed segment names the checkpoint it resumed from
    assert handed["runs"][0][1](True) == [*cmd[:-1], "--ckpt_path=last"]


def trained_copy(
    probe, run, root: Path, logits: dict[int, list[float]] | None, val_loss: float | None = None, step_column=True
) -> Path:
    """The committed run's files under ``root``, its metrics.csv replaced by ``logits`` ({the step measured at: per
    block}; None: a run from before they were logged) and, given ``val_loss``, another loss. Without
    ``step_column``, a run from before ``diagnostics/step`` was logged: only Lightning's row, 9 steps on."""
    path = run.run(root)
    shutil.copytree(run.committed, path)
    if logits is not None:
        n = len(next(iter(logits.values())))
        with (path / "metrics.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            measured = ["diagnostics/step"] if step_column else []
            writer.writerow(["step", *measured, *(f"attn_logit_max/layer_{b:02d}" for b in range(n))])
            for step, values in logits.items():  # Lightning's row: log_every_n_steps - 1 = 9 on
                writer.writerow([step + 9, *([step] if step_column else []), *values])
    if val_loss is not None:
        summary = json.loads((path / "eval.json").read_text())
        (path / "eval.json").write_text(json.dumps({**summary, "val_loss": val_loss}))
    return path


def test_the_table_reads_each_runs_logits_over_training(probe, tmp_path, monkeypatch, capsys):
    lrs = ("0.016", "0.004", "0.008", "0.002")
    growing, bounded, untrained, old = (probe.Probe("prenorm-12l", "placements-12l", lr, "0.25", 0) for lr in lrs)
    monkeypatch.setattr(probe, "PROBES", [growing, bounded, untrained, old])
    root = tmp_path / "runs"
    # 500 steps: the table reads the rows measured at or before steps 0 (the first), 50, 100, 250, 500
    trained_copy(
        probe, growing, root, {0: [3.0, 4.0], 40: [30.0, 8.0], 90: [50.0, 900.0], 240: [1500, 1.0], 490: [20, 1]}
    )
    logits = {0: [3.0, 2.0], 90: [5.0, 6.0], 490: [7.0, 6.5]}
    trained_copy(probe, bounded, root, logits, val_loss=9.0, step_column=False)  # its config: every 10 steps
    trained_copy(probe, old, root, None)
    assert probe.table(root, tmp_path / "export") == 0
    out = capsys.readouterr().out
    assert (
        "| `prenorm-12l` | 0.016 | 0.25 | 0 | 5.383 | yes | 4 (step 0) | 30 (step 40) | 900 (step 90) "
        "| 1.5e+03 (step 240) | 20 (step 490) | 1.5e+03 (240, 0) |" in out
    )
    assert (
        "| `prenorm-12l` | 0.004 | 0.25 | 0 | 9.000 | no | 3 (step 0) | 3 (step 0) | 6 (step 90) | 6 (step 90) |" in out
    )
    assert "prenorm-12l cpu-lr0.008-wf0.25-seed0: not trained yet" in out
    assert f"{old.run(root)}: no attn_logit_max columns" in out
    exported = tmp_path / "export"
    assert (exported / "run-files/prenorm-12l" / growing.name / "eval.json").is_file()
    assert not (exported / "run-files/prenorm-12l" / old.name).exists()
    assert (exported / "attention_logits.png").stat().st_size > 10_000
    lines = (exported / "traces.csv").read_text().splitlines()
    assert lines[0] == "recipe,lr,warmup,seed,step,block,largest_logit" and len(lines) == 1 + 5 + 3
    assert lines[4] == "prenorm-12l,0.016,0.25,0,240,0,1500.0"
    assert "| `prenorm-12l` | 0.016 |" in (exported / "logit-growth.md").read_text()

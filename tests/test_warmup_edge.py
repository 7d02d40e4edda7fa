"""scripts/warmup_edge.py: each suite pick rerun one warmup step past its edge, and the table that sets the two side
by side (the probe's rule: a gain over the suite's LR tolerance)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.scripts import load_script


@pytest.fixture(scope="module")
def edge():
    return load_script("warmup_edge")


def test_every_pick_has_its_seed0_config_and_an_edge_past_it(edge):
    picks = edge.picks()
    assert {row["recipe"] for row in picks} >= {"prenorm-12l", "postnorm-12l", "resi_dual-12l"}
    for row in picks:
        assert (edge.pick_run(row) / "config.yaml").is_file(), row
        new = float(edge.EDGE[row["warmup"]])
        other = {"0.25": 0.5, "0.5": 0.25}[row["warmup"]]  # the grid's other point: the edge lies away from it
        assert abs(new - other) > abs(float(row["warmup"]) - other)


def test_the_fit_command_is_the_picks_config_with_only_the_warmup_and_the_place_changed(edge, tmp_path):
    row = next(r for r in edge.picks() if r["recipe"] == "prenorm-12l")
    cmd = edge.fit_command(row, tmp_path, resume=False)
    assert cmd[cmd.index("--config") + 1] == str(edge.pick_run(row) / "config.yaml")
    assert f"--model.optim.warmup_fraction={edge.EDGE[row['warmup']]}" in cmd
    assert f"--run.root={tmp_path}" in cmd and "--ckpt_path=last" not in cmd
    assert edge.fit_command(row, tmp_path, resume=True) == [*cmd, "--ckpt_path=last"]


def fake_edge_run(edge, row, root: Path, val_loss: float, diverged_at: int | None = None) -> Path:
    """An edge run made of its pick's files with another validation loss, or a divergence (the table reads
    nothing else)."""
    run = edge.edge_run(row, root)
    shutil.copytree(edge.pick_run(row), run)
    summary = json.loads((run / "eval.json").read_text())
    diverged = {"diverged": diverged_at is not None, "diverged_at_step": diverged_at}
    (run / "eval.json").write_text(json.dumps({**summary, "val_loss": val_loss, **diverged}))
    return run


def test_the_table_sets_each_finished_edge_run_beside_its_pick_and_applies_the_rule(edge, tmp_path, capsys):
    rows = {r["recipe"]: r for r in edge.picks()}
    pick = {name: json.loads((edge.pick_run(rows[name]) / "eval.json").read_text())["val_loss"] for name in rows}
    fake_edge_run(edge, rows["prenorm-12l"], tmp_path / "runs", pick["prenorm-12l"] + 0.02)
    fake_edge_run(edge, rows["postnorm-12l"], tmp_path / "runs", pick["postnorm-12l"] - 0.08)
    fake_edge_run(edge, rows["rezero-12l"], tmp_path / "runs", 1.0, diverged_at=16)  # a loss too low, never read
    assert edge.table(tmp_path / "runs", tmp_path / "export") == 0
    out = capsys.readouterr()
    assert f"| {pick['prenorm-12l']:.3f} | " in out.out and "| +0.020 |" in out.out and "| -0.080 |" in out.out
    assert "| diverged (step 16) | - |" in out.out
    assert "by more than 0.05 nats: postnorm-12l." in out.out
    assert "3 of " in out.out and "not finished; left out" in out.err
    exported = tmp_path / "export/postnorm-12l" / edge.edge_run(rows["postnorm-12l"], tmp_path).name
    assert sorted(p.name for p in exported.iterdir()) == sorted(
        p.name for p in edge.RunDir(edge.pick_run(rows["postnorm-12l"])).small_files()
    )
    assert "| `postnorm-12l` |" in (tmp_path / "export/warmup-edge.md").read_text()


@pytest.mark.parametrize(("codes", "expected"), [((0, 3), 0), ((0, 1), 1)])  # 3: diverged, a result
def test_train_runs_each_unfinished_edge_and_fails_only_on_a_failed_fit(edge, tmp_path, monkeypatch, codes, expected):
    rows = [r for r in edge.picks() if r["recipe"] in ("prenorm-12l", "postnorm-12l")]
    monkeypatch.setattr(edge, "picks", lambda: rows)
    checkpoint = edge.edge_run(rows[1], tmp_path) / "checkpoints/last.ckpt"  # an interrupted run: resumed
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"")
    calls = []

    def fake_run(cmd, env, **kwargs):
        calls.append((cmd, env))
        return subprocess.CompletedProcess(cmd, codes[len(calls) - 1])

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert edge.train(tmp_path, jobs=1) == expected
    assert [cmd for cmd, _ in calls] == [
        edge.fit_command(rows[0], tmp_path, False),
        edge.fit_command(rows[1], tmp_path, True),
    ]
    assert all(env[name] == value for _, env in calls for name, value in edge.PORTABLE_ENV.items())

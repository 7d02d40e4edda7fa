"""scripts/dyt_seeds.py: DyT's paper setup at fresh seeds below the suite's pick, and the table that pairs each
setting's seeds with pre-norm's (the suite's rule, and every seed at its own loss)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.scripts import load_script

UNIGRAM = 6.401  # the suite's data (its table says so); the table's reading of it is patched in, not recomputed


@pytest.fixture(scope="module")
def probe():
    return load_script("dyt_seeds")


def test_each_probe_setting_has_its_committed_seed0_config_and_the_reference_its_seeds(probe):
    for lr, warmup in probe.SHOWN:
        assert (probe.suite_run(lr, warmup, 0) / "config.yaml").is_file(), (lr, warmup)
    for seed in probe.SEEDS:
        assert probe.RunDir(probe.suite_run(*probe.REFERENCE_PICK, seed, probe.REFERENCE)).state() == "finished"


def test_the_fit_command_is_the_settings_config_with_only_the_seed_and_the_place_changed(probe, tmp_path):
    cmd = probe.fit_command("0.001", "0.25", 3, tmp_path, resume=False)
    assert cmd[cmd.index("--config") + 1] == str(probe.suite_run("0.001", "0.25", 0) / "config.yaml")
    assert "--seed_everything=3" in cmd and "--data.seed=3" in cmd  # the suite's seed-N runs change both
    assert f"--run.root={tmp_path}" in cmd and "--run.tag=lr0.001-wf0.25" in cmd and "--ckpt_path=last" not in cmd
    assert probe.fit_command("0.001", "0.25", 3, tmp_path, resume=True) == [*cmd, "--ckpt_path=last"]


def fake_run(probe, lr: str, warmup: str, seed: int, root: Path, val_loss: float, diverged_at: int | None = None):
    """A probe run made of the setting's seed-0 files with another loss (the table reads eval.json and the
    readout columns of metrics.csv)."""
    run = probe.probe_run(lr, warmup, seed, root)
    shutil.copytree(probe.suite_run(lr, warmup, 0), run)
    summary = json.loads((run / "eval.json").read_text())
    diverged = {"diverged": diverged_at is not None, "diverged_at_step": diverged_at}
    (run / "eval.json").write_text(json.dumps({**summary, "val_loss": val_loss, **diverged}))
    return run


def test_the_table_counts_failures_and_pairs_by_seed_both_ways(probe, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(probe, "unigram_reference", lambda run: UNIGRAM)
    monkeypatch.setattr(probe, "SHOWN", [("0.001", "0.25")])
    root = tmp_path / "runs"
    ref = {
        s: probe.RunDir(probe.suite_run(*probe.REFERENCE_PICK, s, probe.REFERENCE)).summary()["val_loss"]
        for s in (1, 2, 3)
    }
    fake_run(probe, "0.001", "0.25", 1, root, ref[1] + 0.5)
    fake_run(probe, "0.001", "0.25", 2, root, ref[2] + 0.3)
    fake_run(probe, "0.001", "0.25", 3, root, UNIGRAM + 0.03)  # stuck at the unigram loss: a failure with a loss
    assert probe.table(root, tmp_path / "export") == 0
    out = capsys.readouterr().out
    every = probe.paired_difference({1: ref[1] + 0.5, 2: ref[2] + 0.3, 3: UNIGRAM + 0.03}, ref)
    assert "| 0.001 | 0.25 | 5.571 | 3 | 1/3 (6-79%) | " in out  # the seed-0 run is the suite's, named apart
    assert "| +0.400 ± 1.271 | " in out  # the two that learned: 0.5 and 0.3
    assert f"| +{every.text()} |" in out  # every seed at its own loss
    assert "| 0.001 | 0.25 | 3 | probe | 6.431 | no | " in out
    exported = tmp_path / "export" / probe.RECIPE / probe.run_name("0.001", "0.25", 2)
    assert (exported / "eval.json").is_file() and not (exported / "checkpoints").exists()
    assert "| 0.001 | 0.25 | 2 | probe |" in (tmp_path / "export/dyt-seeds.md").read_text()


def test_a_diverged_seed_is_a_failure_with_no_loss_to_pair(probe, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(probe, "unigram_reference", lambda run: UNIGRAM)
    monkeypatch.setattr(probe, "SHOWN", [("0.001", "0.25")])
    root = tmp_path / "runs"
    fake_run(probe, "0.001", "0.25", 1, root, 5.5)
    fake_run(probe, "0.001", "0.25", 2, root, float("nan"), diverged_at=40)
    assert probe.table(root, None) == 0
    out = capsys.readouterr().out
    assert "| 2 | 1/2 (9-91%) | 5.500 | " in out and "| diverged (step 40) | no | " in out


def test_train_hands_every_probe_seed_to_the_shared_probe_trainer_in_the_portable_arithmetic(
    probe, tmp_path, monkeypatch
):
    # train_probe_runs itself (finished runs skipped, interrupted ones resumed, exit codes): tests/test_warmup_edge.py
    handed = {}
    monkeypatch.setattr(probe, "train_probe_runs", lambda runs, env, jobs, who: handed.update(runs=runs, env=env) or 0)
    assert probe.train(tmp_path, jobs=2) == 0
    wanted = [(lr, wf, seed) for (lr, wf), seeds in probe.PROBE.items() for seed in seeds]
    assert [path for path, _ in handed["runs"]] == [probe.probe_run(*w, tmp_path) for w in wanted]
    assert [command(True) for _, command in handed["runs"]] == [probe.fit_command(*w, tmp_path, True) for w in wanted]
    assert all(handed["env"][name] == value for name, value in probe.PORTABLE_ENV.items())

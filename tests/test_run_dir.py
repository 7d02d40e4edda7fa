"""RunDir, the one reader of a run directory: what an absent file reads as, and a run's state from missing to
unfinished to finished (a finished run stays finished without its checkpoints)."""

from __future__ import annotations

import json

import yaml

from resnorm_lm.train.runs import RunDir


def test_a_run_directory_reads_as_missing_then_unfinished_then_finished(tmp_path):
    run = RunDir(tmp_path / "prenorm-12l" / "smoke-seed1")
    assert run.state() == "missing" and not run.has_checkpoint() and run.checkpoints() == []
    assert run.summary() == {} and run.manifest() == {} and run.config() == {} and run.metrics() == []
    assert run.init() is None  # no config.yaml: the init is not known
    run.checkpoints_dir.mkdir(parents=True)
    run.last_checkpoint.write_bytes(b"a state")
    (run.checkpoints_dir / "step000003.ckpt").write_bytes(b"a state")
    assert run.state() == "unfinished" and [p.name for p in run.checkpoints()] == ["last.ckpt", "step000003.ckpt"]
    run.summary_path.write_text(json.dumps({"finished": False, "preempted": True, "step": 3}))
    assert run.state() == "unfinished"  # preempted: resumed from its checkpoint
    run.summary_path.write_text(json.dumps({"finished": True, "step": 6}))
    assert run.state() == "finished" and run.summary()["step"] == 6
    run.last_checkpoint.unlink()  # deleted to save disk: its results stand
    assert run.state() == "finished" and not run.has_checkpoint()
    run.config_path.write_text(yaml.safe_dump({"model": {"arch": {"n_layer": 2}}}))
    assert run.arch() == {"n_layer": 2} and run.init() == "gpt2"  # a run from before the init was named
    run.config_path.write_text(yaml.safe_dump({"model": {"arch": {"init": "xavier"}}}))
    assert run.init() == "xavier"
    run.manifest_path.write_text(json.dumps({"precision": "bf16-mixed"}))
    assert run.manifest() == {"precision": "bf16-mixed"}
    run.metrics_path.write_text("step,train/loss,val/loss\n0,6.5,\n3,,6.1\n")
    assert run.metrics() == [{"step": 0.0, "train/loss": 6.5}, {"step": 3.0, "val/loss": 6.1}]  # empty cells dropped


def test_the_code_revision_is_dirty_only_when_what_training_reads_changed(tmp_path, monkeypatch):
    import subprocess

    from resnorm_lm.train import runs

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    (tmp_path / "resnorm_lm").mkdir()
    (tmp_path / "resnorm_lm" / "model.py").write_text("width = 128\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("5.032\n")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(runs, "source_checkout", lambda: tmp_path)
    assert runs.code_revision() == commit
    (tmp_path / "docs" / "results.md").unlink()  # results left out of the tree (a device call's travel limit)
    assert runs.code_revision() == commit
    (tmp_path / "resnorm_lm" / "model.py").write_text("width = 256\n")
    assert runs.code_revision() == commit + "+dirty"


def test_a_tables_provenance_keeps_the_dirty_mark_of_a_runs_code(tmp_path):
    from resnorm_lm.analysis.evidence import Provenance

    run = RunDir(tmp_path / "prenorm-12l" / "cpu-seed1")
    run.path.mkdir(parents=True)
    commit = "3730264175" * 4
    for code, printed in ((commit, commit[:12]), (commit + "+dirty", commit[:12] + "+dirty")):
        (run.path / "manifest.json").write_text(json.dumps({"code_revision": code}))
        assert Provenance.of(run.path).short_code == printed

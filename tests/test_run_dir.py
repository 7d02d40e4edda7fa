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

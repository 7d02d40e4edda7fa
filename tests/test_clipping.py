"""Clipping by norm is counted: how many steps it bound, per run (eval.json), per logged step (metrics.csv)."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from resnorm_lm.train.diagnostics import ClipRecord
from tests.smoke import run_cli, smoke_args


def grads_of_norm(norm: float) -> list[torch.Tensor]:
    """Two parameters whose gradients together have global L2 norm ``norm``."""
    params = [torch.zeros(3, requires_grad=True), torch.zeros(4, requires_grad=True)]
    params[0].grad = torch.tensor([norm, 0.0, 0.0])
    params[1].grad = torch.zeros(4)
    return params


def test_the_record_counts_the_steps_where_the_bound_binds_and_clips_as_torch_does():
    record = ClipRecord()
    assert record.summary() is None
    for norm in (3.0, 0.5, 1.5, 0.999):
        params = grads_of_norm(norm)
        total = record.clip(params, 1.0)
        assert total.item() == pytest.approx(norm)
        clipped_norm = torch.linalg.vector_norm(torch.cat([p.grad for p in params])).item()
        assert clipped_norm == pytest.approx(min(norm, 1.0), rel=1e-5)
    assert record.summary() == {"max_norm": 1.0, "steps": 4, "clipped_steps": 2, "clipped_fraction": 0.5}
    resumed = ClipRecord()
    resumed.load_state_dict(json.loads(json.dumps(record.state_dict())))  # as a checkpoint keeps it
    resumed.clip(grads_of_norm(2.0), 1.0)
    assert resumed.summary()["steps"] == 5 and resumed.summary()["clipped_steps"] == 3


@pytest.mark.parametrize("clip, fraction", [(1e-4, 1.0), (1e6, 0.0)])
def test_a_run_records_how_often_its_clip_bound(tmp_path, smoke_corpus, clip, fraction):
    args = smoke_args(
        smoke_corpus, f"--run.root={tmp_path / 'runs'}", f"--trainer.gradient_clip_val={clip}", "--trainer.max_steps=4"
    )
    assert run_cli(args) == 0
    run_dir = tmp_path / "runs/prenorm-12l/smoke-seed1"
    summary = json.loads((run_dir / "eval.json").read_text())["clip"]
    assert summary == {"max_norm": clip, "steps": 4, "clipped_steps": int(4 * fraction), "clipped_fraction": fraction}
    with (run_dir / "metrics.csv").open() as f:
        bound = [float(r["clip/bound"]) for r in csv.DictReader(f) if r.get("clip/bound")]
    assert bound == [fraction] * 4  # the smoke profile logs every step


def test_without_clipping_nothing_is_counted(tmp_path, smoke_corpus):
    args = smoke_args(
        smoke_corpus, f"--run.root={tmp_path / 'runs'}", "--trainer.gradient_clip_val=0", "--trainer.max_steps=2"
    )
    assert run_cli(args) == 0
    assert json.loads((tmp_path / "runs/prenorm-12l/smoke-seed1/eval.json").read_text())["clip"] is None

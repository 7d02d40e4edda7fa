"""metrics.csv across a resume: earlier rows kept on rank 0, nothing written on the other ranks."""

from __future__ import annotations

import csv

from lightning.pytorch.utilities import rank_zero_only

from resnorm_lm.train.callbacks import ContinuedCSVLogger


def write_metrics(path, steps):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["step", "train/loss"])
        writer.writeheader()
        writer.writerows({"step": s, "train/loss": 1.0 / (s + 1)} for s in steps)


def test_a_resumed_run_keeps_the_rows_up_to_its_checkpoint(tmp_path):
    write_metrics(tmp_path / "metrics.csv", range(6))
    logger = ContinuedCSVLogger(tmp_path, resume_step=3)
    logger.log_metrics({"train/loss": 0.5}, step=4)
    logger.save()
    with (tmp_path / "metrics.csv").open() as f:
        assert [int(row["step"]) for row in csv.DictReader(f)] == [0, 1, 2, 3, 4]


def test_a_resumed_ddp_run_starts_on_every_rank(tmp_path, monkeypatch):
    """Ranks above 0 get Lightning's dummy experiment, which must be left alone (it once crashed rank 1)."""
    write_metrics(tmp_path / "metrics.csv", range(6))
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger = ContinuedCSVLogger(tmp_path, resume_step=3)
    logger.experiment.log_metrics({"train/loss": 0.5}, 4)  # a no-op on this rank
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 7  # untouched: rank 0 writes it

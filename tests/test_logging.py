"""metrics.csv across a resume: earlier rows kept on rank 0, nothing written on the other ranks."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest
from lightning.pytorch.utilities import rank_zero_only

from resnorm_lm.train.callbacks import ContinuedCSVLogger
from tests.smoke import run_cli, smoke_args


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


# ---------------------------------------------------------------- Weights & Biases (run.logger: wandb)


def wandb_records(path: Path) -> list:
    """The records of a W&B run file (``run-<id>.wandb``): a 7-byte header, then LevelDB-log-style chunks in
    32 KiB blocks (crc 4 bytes, length 2, type 1: full, first, middle, last), each record a protobuf ``Record``."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    data, pos, block, records, pending = path.read_bytes(), 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if pos + 7 + length > len(data):
            break  # a chunk the service is still writing
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(pending)
            except DecodeError:
                if pos + 7 <= len(data):
                    raise  # a damaged record with more after it: the reader or the file is wrong
                break  # the file's last record, caught half-written
            records.append(record)
            pending = b""
    return records


def finished_wandb_records(path: Path, patience_s: float = 60.0) -> list:
    """The run file's records once its exit record is there: W&B's service process writes the file on its own
    time, and may still be writing when ``finish()`` has returned (seen on a loaded machine)."""
    deadline = time.monotonic() + patience_s
    while True:
        records = wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def test_a_wandb_run_logs_beside_metrics_csv_and_resumes_as_one_run(tmp_path, smoke_corpus, monkeypatch):
    pytest.importorskip("wandb")
    from resnorm_lm.train.lightning_cli import wandb_run_id

    monkeypatch.setenv("WANDB_MODE", "offline")  # no network: the run's files stay under the run directory
    monkeypatch.setenv("WANDB_SILENT", "true")
    args = smoke_args(
        smoke_corpus,
        f"--run.root={tmp_path}",
        "--trainer.max_steps=2",
        "--trainer.val_check_interval=2",
        "--run.logger=wandb",
        "--run.group=suite-demo",
    )
    assert run_cli([*args, "--run.stop_after_steps=1"]) == 0
    assert run_cli([*args, "--ckpt_path=last"]) == 0
    run_dir = tmp_path / "prenorm-12l" / "smoke-seed1"
    files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 2 and {f.name for f in files} == {f"run-{wandb_run_id(run_dir)}.wandb"}  # one id
    for segment, first_step in zip(files, (0, 1), strict=True):
        records = finished_wandb_records(segment)
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        assert (run.run_group, run.display_name, run.project) == ("suite-demo", "prenorm-12l/smoke-seed1", "resnorm-lm")
        updates = {u.key for r in records if r.WhichOneof("record_type") == "config" for u in r.config.update}
        assert "manifest" in updates  # code, versions, hardware and arithmetic, as manifest.json has them
        steps = [
            json.loads(item.value_json)
            for r in records
            if r.WhichOneof("record_type") == "history"
            for item in r.history.item
            if "/".join(item.nested_key) == "trainer/global_step"
        ]
        logged = {
            "/".join(i.nested_key) for r in records if r.WhichOneof("record_type") == "history" for i in r.history.item
        }
        assert "train/loss" in logged and min(steps) == first_step  # the resumed segment goes on from its step


def test_a_wandb_run_without_wandb_installed_says_how_to_get_it(tmp_path, smoke_corpus, monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    code = run_cli(smoke_args(smoke_corpus, f"--run.root={tmp_path}", "--run.logger=wandb"))
    assert code != 0 and "pip install 'resnorm-lm[wandb]'" in capsys.readouterr().err
    assert not (tmp_path / "prenorm-12l").exists()  # refused before a run directory was made


def test_sweeps_and_suites_group_their_runs():
    from resnorm_lm.analysis.compare import sweep_group
    from resnorm_lm.analysis.launchers import SweepTrainer
    from resnorm_lm.analysis.sweep import RunSpec, Setting

    assert sweep_group("/data/my runs", "cpu") == "compare-my-runs-cpu"  # no spaces: SLURM splits options
    trainer = SweepTrainer("cpu", "runs", [], jobs=1, group="suite-placements-12l")
    spec = RunSpec("prenorm-12l", Setting(lr=1e-3, warmup=0.25), seed=1)
    assert "--run.group=suite-placements-12l" in trainer.command(spec, resume=False)
    assert not any(a.startswith("--run.group") for a in SweepTrainer("cpu", "runs", [], jobs=1).command(spec, False))

"""SLURM without a cluster: which job a process is a task of, Lightning's own requeue turned off, the resume of a
requeued start, and the warning signal's save and requeue in a run given SLURM's variables and a stand-in
``scontrol``. tests/test_slurm_jobs.py runs the same against a real SLURM."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment

from resnorm_lm.train.lightning_cli import ResnormCLI
from resnorm_lm.train.preemption import SlurmJob, resume_after_requeue
from resnorm_lm.train.recipes import expand_recipe_arguments
from tests.smoke import assert_same_training_state, run_cli, smoke_args, write_corpus

REPO = Path(__file__).resolve().parents[1]
# what srun gives the one task of a one-node, one-task job
SRUN_TASK = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NAME": "resnorm-lm",
    "SLURM_NTASKS": "1",
    "SLURM_NNODES": "1",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "localhost",
}


@pytest.fixture
def no_slurm(monkeypatch) -> None:
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def srun_task(no_slurm, monkeypatch) -> None:
    for name, value in SRUN_TASK.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def fake_scontrol(folder: Path, script: str) -> str:
    """A PATH whose ``scontrol`` is ``script`` (bash), ahead of the real one."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scontrol").write_text(f"#!/usr/bin/env bash\n{script}\n")
    (folder / "scontrol").chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def test_a_task_that_srun_started_is_a_slurm_job_and_a_plain_process_is_not(no_slurm, monkeypatch):
    assert SlurmJob.from_environment() is None
    for name, value in SRUN_TASK.items():
        monkeypatch.setenv(name, value)
    assert SlurmJob.from_environment() == SlurmJob(job_id="4242", restarts=0)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4240")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    assert SlurmJob.from_environment() == SlurmJob(job_id="4240_2", restarts=2)  # what scontrol requeue takes
    with warnings.catch_warnings():  # Lightning's hint to use srun, where srun is installed
        warnings.simplefilter("ignore")
        monkeypatch.setenv("SLURM_JOB_NAME", "interactive")  # Lightning's rule: an interactive shell is no launch
        assert SlurmJob.from_environment() is None
        monkeypatch.setenv("SLURM_JOB_NAME", "resnorm-lm")
        monkeypatch.delenv("SLURM_NTASKS")  # the batch script itself, before srun
        assert SlurmJob.from_environment() is None


def test_a_requeued_start_resumes_from_last_ckpt_and_any_other_start_as_asked(tmp_path):
    last, first, requeued = tmp_path / "last.ckpt", SlurmJob("7", restarts=0), SlurmJob("7", restarts=1)
    assert resume_after_requeue(None, last, requeued) is None  # requeued before its first save: starts afresh
    last.write_bytes(b"a checkpoint")
    assert resume_after_requeue(None, last, None) is None  # not under SLURM
    assert resume_after_requeue(None, last, first) is None  # a first start (the resume checks then refuse)
    assert resume_after_requeue("last", last, first) == "last"
    assert resume_after_requeue(None, last, requeued) == str(last)
    assert resume_after_requeue(str(tmp_path / "step000100.ckpt"), last, requeued) == str(last)  # the newest


def test_requeue_asks_scontrol_and_reports_why_it_did_not_take(tmp_path, monkeypatch):
    asked = tmp_path / "asked"
    monkeypatch.setenv("PATH", fake_scontrol(tmp_path / "ok", f'echo "$@" > {asked}'))
    assert SlurmJob("4240_2", restarts=0).requeue() is None
    assert asked.read_text().split() == ["requeue", "4240_2"]
    refusal = "scontrol: error: Requested operation is presently disabled"
    monkeypatch.setenv("PATH", fake_scontrol(tmp_path / "no", f'echo "{refusal}" >&2; exit 1'))
    assert SlurmJob("7", restarts=0).requeue() == refusal
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no scontrol at all
    assert "scontrol" in SlurmJob("7", restarts=0).requeue()


def cluster_environment(tmp_path: Path, corpus: str):
    args = expand_recipe_arguments(smoke_args(corpus, f"--run.root={tmp_path}", cache_dir=tmp_path / "cache"))
    trainer = ResnormCLI(args=args[1:], run=False).trainer  # without the subcommand: built, not run
    return trainer._accelerator_connector.cluster_environment


def test_under_srun_lightnings_mid_step_save_and_requeue_is_off(srun_task, tmp_path, corpus):
    """Lightning's SLURM environment (ranks and addresses from SLURM) without its SIGUSR1 handler: the
    warning is the run's own (the run's Preemption with its SLURM job, in the test below)."""
    environment = cluster_environment(tmp_path, corpus)
    assert isinstance(environment, SLURMEnvironment) and environment.auto_requeue is False


def test_off_slurm_no_slurm_environment(no_slurm, tmp_path, corpus):
    assert not isinstance(cluster_environment(tmp_path, corpus), SLURMEnvironment)


def test_the_warning_mid_window_saves_at_its_end_requeues_and_the_requeued_start_resumes_bit_exact(
    no_slurm, tmp_path, corpus
):
    """SIGUSR1 at micro-batch 4, the first of the third window (accumulation 2): saved at its end, step 3."""
    training = [
        "--model.arch.n_layer=2",
        "--model.arch.dropout=0.1",
        "--trainer.max_steps=5",
        "--trainer.accumulate_grad_batches=2",
        "--run.checkpoint_every=100",
    ]
    assert (
        run_cli(smoke_args(corpus, f"--run.root={tmp_path / 'uninterrupted'}", *training, cache_dir=tmp_path / "cache"))
        == 0
    )
    root, asked = tmp_path / "slurm", tmp_path / "asked"
    probe = "--trainer.callbacks+=tests.slurm_probe.SignalAtMicroBatch"
    argv = smoke_args(corpus, f"--run.root={root}", *training, probe, cache_dir=tmp_path / "cache")
    env = {
        **os.environ,
        **SRUN_TASK,
        "PYTHONPATH": str(REPO),
        "RESNORM_LM_SIGNAL_AT": "USR1:4",
        "PATH": fake_scontrol(tmp_path / "bin", f'echo "$@" > {asked}'),
    }

    def start(**more: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "resnorm_lm", *argv],
            cwd=REPO,
            env={**env, **more},
            capture_output=True,
            text=True,
            timeout=300,
        )

    stopped = start()
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert asked.read_text().split() == ["requeue", "4242"]
    assert "SLURM's warning signal (SIGUSR1): saved" in stopped.stdout and "requeued SLURM job 4242" in stopped.stdout
    last = root / "prenorm-12l" / "smoke-seed1" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    processed = saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["processed"]
    assert (saved["global_step"], processed) == (3, 6)  # the window's end, not the micro-batch signalled
    resumed = start(SLURM_RESTART_COUNT="1", RESNORM_LM_SIGNAL_AT="")  # the same command, requeued
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "SLURM job 4242 was requeued (1 time(s)): resuming from" in resumed.stdout
    reference = tmp_path / "uninterrupted" / "prenorm-12l" / "smoke-seed1" / "checkpoints" / "last.ckpt"
    assert_same_training_state(torch.load(reference, weights_only=True), torch.load(last, weights_only=True))

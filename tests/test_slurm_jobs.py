"""Runs under a real SLURM (tests/slurm_cluster.py): scripts/slurm/train.sbatch as 2 DDP tasks under srun, and
a run stopped by SLURM's signals: the warning (USR1) requeues it and it resumes by itself, a cancel (SIGTERM)
leaves last.ckpt for a RESUME=last; either way bit-exact with an uninterrupted run on the CPU.

Slow: 20 to 30 s each on 2 busy cores; CI runs them against the repository's own cluster (.ci/run).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.slurm_cluster import SlurmCluster, slurm_cluster  # noqa: F401 (a fixture)
from tests.smoke import assert_same_training_state, run_cli, smoke_args, train_losses, write_corpus

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
STEPS = 12
SIGNAL_AFTER_STEP = 3  # a test signals a job once its run has reached this optimizer step
# two micro-batches per optimizer step: a signal lands mid-window as often as not, and the save must wait for
# the window's end; no periodic checkpoint before the signal's (every 100)
TRAINING = [
    "--model.arch.n_layer=2",
    "--model.arch.dropout=0.1",
    f"--trainer.max_steps={STEPS}",
    "--trainer.accumulate_grad_batches=2",
    "--trainer.val_check_interval=8",
    "--run.checkpoint_every=100",
]


@pytest.fixture(scope="module")
def cluster(slurm_cluster) -> SlurmCluster:  # noqa: F811 (the imported fixture)
    """The session's cluster (tests/slurm_cluster.py), by a name that does not shadow its import."""
    return slurm_cluster


@pytest.fixture(scope="module")
def setting(tmp_path_factory) -> dict:
    """A corpus, and the uninterrupted run (in this process, no SLURM) that the stopped runs must equal."""
    tmp = tmp_path_factory.mktemp("slurm")
    setting = {"tmp": tmp, "corpus": write_corpus(tmp / "corpus")}
    assert (
        run_cli(
            smoke_args(setting["corpus"], f"--run.root={tmp / 'uninterrupted'}", *TRAINING, cache_dir=tmp / "cache")
        )
        == 0
    )
    setting["uninterrupted"] = run_dir(tmp / "uninterrupted")
    return setting


def run_dir(root: Path) -> Path:
    return root / "prenorm-12l" / "smoke-seed1"


def checkpoint(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def job_environment(setting: dict, root: Path, *args: str, **env: str) -> dict[str, str]:
    """train.sbatch's variables for a smoke run of the test corpus under ``root``."""
    data = smoke_args(setting["corpus"], cache_dir=setting["tmp"] / "cache")[
        5:
    ]  # the corpus, cache and progress-bar options
    return {
        "RECIPE": "prenorm-12l",
        "PROFILE": "smoke",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
        "ARGS": " ".join([*data, f"--run.root={root}", *args]),
        **env,
    }


def submit(cluster: SlurmCluster, log: Path, env: dict[str, str], *options: str) -> str:
    return cluster.submit(SBATCH, f"--output={log}", *options, **env)


@dataclass(frozen=True)
class PacedJob:
    """A job of TRAINING, paced (tests/slurm_probe.py) so that a test signals it mid-run."""

    job_id: str
    env: dict[str, str]  # its sbatch environment, to submit it again
    run: Path  # its run directory
    log: Path  # the job's output


def paced_job(cluster: SlurmCluster, setting: dict, tmp_path: Path) -> PacedJob:
    """A paced job submitted and running, once its run is past SIGNAL_AFTER_STEP."""
    root, probe, log = tmp_path / "runs", tmp_path / "probe", tmp_path / "job.out"
    probe.mkdir()
    env = job_environment(
        setting, root, *TRAINING, "--trainer.callbacks+=tests.slurm_probe.PacedSteps", RESNORM_LM_PROBE_DIR=str(probe)
    )
    job = PacedJob(submit(cluster, log, env), env, run_dir(root), log)

    def past_the_step(state: dict[str, str]) -> bool:
        step = probe / "step"
        return step.is_file() and int(step.read_text() or 0) >= SIGNAL_AFTER_STEP

    cluster.wait(job.job_id, past_the_step, timeout=300, log=log)
    return job


def assert_stopped_at_a_step_end(run: Path) -> int:
    """The run saved last.ckpt at the end of an optimizer step before its last, recorded it as preempted."""
    saved = checkpoint(run)
    step = saved["global_step"]
    assert SIGNAL_AFTER_STEP <= step < STEPS
    assert saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["processed"] == 2 * step
    summary = json.loads((run / "eval.json").read_text())
    assert summary["preempted"] is True and summary["finished"] is False and summary["step"] == step
    return step


def assert_same_as_uninterrupted(setting: dict, run: Path, stopped_at: int) -> None:
    reference = setting["uninterrupted"]
    assert_same_training_state(checkpoint(reference), checkpoint(run))
    assert train_losses(run) == train_losses(reference)
    ended, expected = (json.loads((r / "eval.json").read_text()) for r in (run, reference))
    assert ended["finished"] is True and ended["val_loss"] == expected["val_loss"]
    segments = json.loads((run / "manifest.json").read_text())["segments"]
    assert [s["resumed_from_step"] for s in segments] == [0, stopped_at]


def test_two_ddp_tasks_under_srun_train_one_run(cluster, setting, tmp_path):
    root, probe, log = tmp_path / "runs", tmp_path / "probe", tmp_path / "job.out"
    probe.mkdir()
    env = job_environment(
        setting,
        root,
        "--trainer.strategy=ddp",
        "--trainer.max_steps=4",
        "--trainer.callbacks+=tests.ddp_probe.RecordRankBatches",
        RESNORM_LM_PROBE_DIR=str(probe),
    )
    job_id = submit(cluster, log, env, "--ntasks-per-node=2")
    job = cluster.wait_until_done(job_id, timeout=300, log=log)
    out = log.read_text()
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), out[-4000:]
    assert "1 node(s) x 2 task(s)" in out and "RESULT run=" in out
    ranks = [json.loads((probe / f"rank{r}.json").read_text()) for r in (0, 1)]  # both ranks trained
    assert ranks[0]["weights"] == ranks[1]["weights"]
    assert not {tuple(w) for w in ranks[0]["windows"]} & {tuple(w) for w in ranks[1]["windows"]}
    saved = checkpoint(run_dir(root))
    assert saved["global_step"] == 4 and saved["run"]["world_size"] == 2
    assert json.loads((run_dir(root) / "manifest.json").read_text())["world_size"] == 2


def test_the_warning_signal_saves_at_a_step_end_requeues_and_resumes_bit_exact(cluster, setting, tmp_path):
    paced = paced_job(cluster, setting, tmp_path)
    job_id = paced.job_id
    cluster.command("scancel", "--signal=USR1", job_id)  # as --signal=USR1@90 does before the time limit
    requeued = lambda job: int(job["Restarts"]) >= 1 and job["JobState"] == "PENDING"  # noqa: E731
    cluster.wait(job_id, requeued, timeout=120, log=paced.log)
    out = paced.log.read_text()
    assert "SLURM's warning signal (SIGUSR1): saved" in out and f"requeued SLURM job {job_id}" in out, out[-4000:]
    stopped_at = assert_stopped_at_a_step_end(paced.run)
    # SLURM holds a requeued job for about two minutes before it is eligible; no need to wait that long here.
    # Not "now" either: slurmd refuses a credential made in the same second as the old one's revocation
    # ("Job credential revoked", the job FAILED), the race SLURM's hold is there to avoid.
    cluster.command("scontrol", "update", f"JobId={job_id}", "StartTime=now+2")
    job = cluster.wait_until_done(job_id, timeout=300, log=paced.log)
    out = paced.log.read_text()
    assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("COMPLETED", "0:0", "1"), out[-4000:]
    assert f"SLURM job {job_id} was requeued (1 time(s)): resuming from" in out
    assert_same_as_uninterrupted(setting, paced.run, stopped_at)


def test_a_cancelled_job_leaves_its_checkpoint_and_says_how_to_resume_bit_exact(cluster, setting, tmp_path):
    paced = paced_job(cluster, setting, tmp_path)
    cluster.command("scancel", paced.job_id)  # SIGTERM, then SIGKILL after KillWait
    job = cluster.wait_until_done(paced.job_id, timeout=120, log=paced.log)
    out = paced.log.read_text()
    assert (job["JobState"], job["Restarts"]) == ("CANCELLED", "0"), out[-4000:]
    said = rf"SLURM job {paced.job_id} stopped by SIGTERM .* resubmit it with RESUME=last"
    assert re.search(said, out), out[-4000:]
    stopped_at = assert_stopped_at_a_step_end(paced.run)
    log = tmp_path / "again.out"
    job = cluster.wait_until_done(submit(cluster, log, {**paced.env, "RESUME": "last"}), 300, log)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), log.read_text()[-4000:]
    assert_same_as_uninterrupted(setting, paced.run, stopped_at)

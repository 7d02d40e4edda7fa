"""Runs under SLURM: the job a process belongs to, its warning signal and requeue, and the resume that follows.

Lightning's own SLURM support was read (lightning 2.6, ``SLURMEnvironment`` and the trainer's signal
connector) and is used only in part. Its environment stays: under ``srun`` it takes the ranks, the world size
and the main address and port from SLURM's variables, and checks that ``--ntasks-per-node`` equals the
devices. Its requeue (``auto_requeue=True``, the default when Lightning detects ``srun``) does not fit this
repository's contract, so it is turned off:

* it saves from inside the SIGUSR1 handler, wherever the signal lands: mid-backward, or in the middle of a
  gradient-accumulation window whose gradients no checkpoint holds, so the resumed run would not match an
  uninterrupted one;
* it writes ``hpc_ckpt_<n>.ckpt`` beside the run (not ``checkpoints/last.ckpt``), and the requeued job loads
  the newest one inside ``fit``, past the resume checks (resnorm_lm/train/resume.py);
* it requeues at once and trains on until SLURM kills the job.

Instead the warning signal (``--signal=USR1@90``) goes the way of a SIGTERM (resnorm_lm/train/preemption.py: a
flag, a save of ``last.ckpt`` at the end of the current optimizer step, atomic, then out), and only then does
rank 0 call ``scontrol requeue``. The requeued job runs the same command; a start with SLURM_RESTART_COUNT
set continues the run from its ``last.ckpt`` (``resume_after_requeue``), with every resume check.

A SIGTERM is not the warning: SLURM sends it for ``scancel``, the time limit and preemption alike, and only
the site's preemption mode knows whether the job comes back. The run saves and stops as anywhere else, and
says how to resume should it not.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_only

REQUEUE_SIGNAL = signal.SIGUSR1  # the warning the sbatch script asks for: --signal=USR1@<seconds>
RESUME_HINT = "resubmit it with RESUME=last (docs/cluster.md)"


@dataclass(frozen=True)
class SlurmJob:
    """The SLURM job whose task this process is (started by ``srun``, as Lightning's SLURMEnvironment detects)."""

    job_id: str  # what scontrol takes: "1234", or "1234_5" for a task of a job array
    restarts: int  # SLURM_RESTART_COUNT: how many times the job was requeued

    @classmethod
    def from_environment(cls, env: dict[str, str] | None = None) -> SlurmJob | None:
        env = os.environ if env is None else env
        if "SLURM_JOB_ID" not in env or not SLURMEnvironment.detect():  # detect() reads os.environ
            return None
        array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        job_id = f"{array_job}_{array_task}" if array_job and array_task else env["SLURM_JOB_ID"]
        return cls(job_id=job_id, restarts=int(env.get("SLURM_RESTART_COUNT") or 0))

    def requeue(self) -> str | None:
        """Ask SLURM to requeue this job (it ends the job's processes); the error, or None when it took."""
        try:
            done = subprocess.run(["scontrol", "requeue", self.job_id], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            return str(err)
        return None if done.returncode == 0 else (done.stderr or done.stdout).strip() or f"exit {done.returncode}"


def cluster_plugins(job: SlurmJob | None) -> list:
    """Lightning's SLURM environment without its mid-step hpc checkpoint and requeue (see above); none off SLURM."""
    return [] if job is None else [SLURMEnvironment(auto_requeue=False)]


def resume_after_requeue(ckpt_path: str | None, last_checkpoint: Path, job: SlurmJob | None) -> str | None:
    """The checkpoint a start resumes from: as the command says, except in a requeued job, which runs the same
    command again and continues its run from ``last_checkpoint`` when there is one (a first start has none;
    a job requeued before its first save starts afresh)."""
    if job is None or job.restarts == 0 or not last_checkpoint.is_file():
        return ckpt_path
    if rank_zero_only.rank == 0:
        print(
            f"resnorm-lm: SLURM job {job.job_id} was requeued ({job.restarts} time(s)): resuming from "
            f"{last_checkpoint}",
            flush=True,
        )
    return str(last_checkpoint)

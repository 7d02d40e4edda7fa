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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lightning as L
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_only

from resnorm_lm.train.preemption import Preempted, PreemptOnSigterm

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


class RequeueOnWarning(PreemptOnSigterm):
    """``PreemptOnSigterm`` under SLURM, plus its warning signal: save at the end of the step, then requeue.

    USR1 raises the same flag as SIGTERM (shared across DDP ranks the same way, and a second signal of either
    kind still exits at once), so the save happens at an optimizer-step boundary into ``last.ckpt``. Once it
    is written and the run recorded as preempted, rank 0 requeues the job; SLURM then ends every task (their
    SIGTERM is the second signal: out at once, nothing left to write) and starts the job again later.
    After a SIGTERM alone the run stops without requeueing, and says how to resume.
    """

    def __init__(
        self,
        job: SlurmJob,
        checkpoint_path: Path,
        on_preempted: Callable[[], None] = lambda: None,
        ddp_check_every: int = 10,
    ) -> None:
        super().__init__(checkpoint_path, on_preempted, ddp_check_every)
        self.job = job
        self.warned = False  # the requeue signal came (on this rank; SLURM signals every task)
        self.previous_handler = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # as early as a callback can: USR1's default action ends the process (Lightning leaves USR1 alone
        # with auto_requeue off)
        self.previous_handler = signal.signal(REQUEUE_SIGNAL, self._on_warning)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.previous_handler is not None:
            signal.signal(REQUEUE_SIGNAL, self.previous_handler)

    def _on_warning(self, signum, frame) -> None:
        self.warned = True
        self._on_signal(signum, frame)
        self.exit_code = 128 + signal.SIGTERM  # as a job stopped by SLURM's SIGTERM: its docs' exit-code table

    def _save(self, trainer: L.Trainer) -> None:
        if not self.warned:
            return super()._save(trainer)
        trainer.save_checkpoint(self.checkpoint_path, weights_only=False)  # optimizer, loops, callbacks too
        self.saved_at_step = trainer.global_step
        if trainer.is_global_zero:
            print(
                f"resnorm-lm: SLURM's warning signal ({REQUEUE_SIGNAL.name}): saved {self.checkpoint_path} at "
                f"step {trainer.global_step}",
                flush=True,
            )

    def _leave(self) -> None:
        self.on_preempted()
        if rank_zero_only.rank == 0:
            print(self._requeue() if self.warned else self._after_sigterm(), flush=True)
        raise Preempted(f"preempted at step {self.saved_at_step}", self.exit_code)

    def _requeue(self) -> str:
        error = self.job.requeue()
        if error is None:
            return f"resnorm-lm: requeued SLURM job {self.job.job_id}: it resumes from last.ckpt when it starts again"
        return f"resnorm-lm: could not requeue SLURM job {self.job.job_id} ({error}); {RESUME_HINT}"

    def _after_sigterm(self) -> str:
        return (
            f"resnorm-lm: SLURM job {self.job.job_id} stopped by SIGTERM (scancel, time limit or preemption). "
            f"If SLURM requeues it, it resumes from last.ckpt by itself; if not, {RESUME_HINT}"
        )


def preemption_callback(job: SlurmJob | None, checkpoint_path: Path, on_preempted: Callable[[], None]):
    """What saves a run that is asked to stop: ``RequeueOnWarning`` under SLURM, else ``PreemptOnSigterm``."""
    if job is None:
        return PreemptOnSigterm(checkpoint_path, on_preempted=on_preempted)
    return RequeueOnWarning(job, checkpoint_path, on_preempted=on_preempted)

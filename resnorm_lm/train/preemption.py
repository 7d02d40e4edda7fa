"""Stopping and coming back: on SIGTERM (or a first Ctrl-C, or SLURM's warning signal) a run saves last.ckpt at the
end of the current optimizer step and leaves; under SLURM it requeues itself and resumes when it starts again."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_only

from resnorm_lm.train.callbacks import StepBoundary

# What a fit that ``compare`` started gets from the kernel when compare dies (resnorm_lm/analysis/launchers.py):
# a stop like SIGTERM's, but never the "second signal, out at once" one, as the kernel may send it more than once
# (once for each of compare's threads that exits after taking the fit over)
LAUNCHER_GONE = signal.SIGUSR2


class Preempted(Exception):  # noqa: N818 (a request, not an error)
    """Raised once a stop signal's checkpoint and summary are written: the process exits with ``exit_code``
    (128 + the signal: 143 for SIGTERM, 130 for Ctrl-C, as if the signal had ended it) without more work."""

    def __init__(self, message: str, exit_code: int = 128 + signal.SIGTERM) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Preemption(StepBoundary):
    """On SIGTERM (SLURM and most schedulers send it before SIGKILL), or a first Ctrl-C, save last.ckpt and leave
    at once; under SLURM (``job``), its warning signal too, and then requeue the job.

    The signal only sets a flag. At the end of the current optimizer step (with
    gradient accumulation: after the last micro-batch of the current window, whose
    gradients no checkpoint could hold), or after the current batch of a validation
    pass that follows a finished step, the callback writes last.ckpt atomically,
    calls ``on_preempted`` (which records the run as preempted and prints its
    RESULT line) and raises ``Preempted``: no end-of-run evaluation, no sample,
    so the process ends within one step plus one checkpoint write. A SIGINT
    (Ctrl-C) does the same, unless the process started with SIGINT ignored (a
    shell's background job), which it keeps. A second signal of either kind
    meanwhile exits at once; the checkpoint being written stays atomic (its
    temp file is removed at the next start). Under DDP the
    flag is shared across ranks every ``ddp_check_every`` optimizer steps (a
    collective and a host sync, so not at every step), at the same micro-batch
    on every rank, and all ranks stop at the same step.

    Under SLURM, the warning signal (``--signal=USR1@<seconds>``) raises the same flag, so the save happens at an
    optimizer-step boundary into ``last.ckpt``; once it is written and the run recorded as preempted, rank 0
    requeues the job, and SLURM then ends every task (their SIGTERM is the second signal: out at once, nothing
    left to write) and starts the job again later. After a SIGTERM alone the run stops without requeueing, and
    says how to resume.
    """

    def __init__(
        self,
        checkpoint_path: Path,
        on_preempted: Callable[[], None] = lambda: None,
        ddp_check_every: int = 10,
        job: SlurmJob | None = None,
    ) -> None:
        self.checkpoint_path = checkpoint_path
        self.job = job
        self.warned = False  # SLURM's warning came (on this rank; SLURM signals every task)
        self.previous_handler = None
        self.on_preempted = on_preempted
        self.ddp_check_every = max(1, ddp_check_every)
        self.requested = False
        self.signal_name = "SIGTERM"  # the stop signal this rank received (another rank's: SIGTERM)
        self.exit_code = 128 + signal.SIGTERM
        self.saved_at_step: int | None = None
        # whether the last training micro-batch ended its optimizer step; a run starts (or resumes) at a step
        self.at_step_boundary = True

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.job is not None:  # as early as a callback can: USR1's default action ends the process
            self.previous_handler = signal.signal(REQUEUE_SIGNAL, self._on_warning)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.previous_handler is not None:
            signal.signal(REQUEUE_SIGNAL, self.previous_handler)

    def _on_warning(self, signum, frame) -> None:
        self.warned = True
        self._on_signal(signum, frame)
        self.exit_code = 128 + signal.SIGTERM  # as a job stopped by SLURM's SIGTERM: its docs' exit-code table

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after Lightning registers its own handlers (its SIGTERM one would stop mid-validation without saving,
        # and Ctrl-C's KeyboardInterrupt stops without saving); Lightning's teardown restores the previous ones
        signal.signal(signal.SIGTERM, self._on_signal)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(LAUNCHER_GONE, self._on_launcher_gone)

    def _on_launcher_gone(self, signum, frame) -> None:
        if not self.requested:
            self._on_signal(signum, frame)

    def _on_signal(self, signum, frame) -> None:
        if self.requested:  # asked twice: the user or scheduler wants out now
            os._exit(128 + signum)
        self.requested = True
        self.signal_name = {signal.SIGINT: "Ctrl-C (SIGINT)", LAUNCHER_GONE: "its compare ended"}.get(
            signum, signal.Signals(signum).name
        )
        self.exit_code = 128 + signum
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, self._on_signal)

    def _requested_on_any_rank(self, trainer: L.Trainer, count: int) -> bool:
        """``count`` (a step or batch index, the same on every rank) says when the ranks compare flags."""
        if trainer.world_size > 1:
            if count % self.ddp_check_every:
                return False
            return trainer.strategy.reduce_boolean_decision(self.requested, all=False)
        return self.requested

    def _save(self, trainer: L.Trainer) -> None:
        trainer.save_checkpoint(self.checkpoint_path, weights_only=False)  # optimizer, loops, callbacks too
        self.saved_at_step = trainer.global_step
        if trainer.is_global_zero:
            said = f"saved {self.checkpoint_path} at step {trainer.global_step}"
            if self.warned:
                print(f"resnorm-lm: SLURM's warning signal ({REQUEUE_SIGNAL.name}): {said}", flush=True)
            else:
                print(f"resnorm-lm: {self.signal_name}: {said}; continue with RESUME=last", flush=True)

    def _leave(self) -> None:
        self.on_preempted()
        if self.job is not None and rank_zero_only.rank == 0:
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

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        # mid-window, train on to the window's end (StepBoundary); every rank has the same windows, so the
        # ranks check at the same counts
        self.at_step_boundary = self.ended_optimizer_step(trainer)
        if (
            self.saved_at_step is None
            and self.at_step_boundary
            and self._requested_on_any_rank(trainer, trainer.global_step)
        ):
            self._save(trainer)  # leave right after Lightning has logged this step's metrics:

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self.saved_at_step is not None:  # at the next batch,
            self._leave()
        super().on_train_batch_start(trainer, *args)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.saved_at_step is not None:  # before a validation pass would start,
            self._leave()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.saved_at_step is not None:  # or when that was the last step
            self._leave()

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int, *args) -> None:
        fitting = trainer.state.fn == "fit"
        # val_check_interval counts micro-batches: a pass in the middle of a window finishes, and the
        # training micro-batches after it finish the window before saving (on_train_batch_end)
        if trainer.sanity_checking or (fitting and not self.at_step_boundary):
            return
        if not self._requested_on_any_rank(trainer, batch_idx):
            return
        if fitting:  # the weights are those of a finished step; after fit, last.ckpt is final
            self._save(trainer)
        self.saved_at_step = trainer.global_step
        self._leave()


# ---------------------------------------------------------------------------------------------------------------------
# Runs under SLURM: the job a process belongs to, its warning signal and requeue, and the resume that follows.
#
# Lightning's own SLURM support was read (lightning 2.6, ``SLURMEnvironment`` and the trainer's signal
# connector) and is used only in part. Its environment stays: under ``srun`` it takes the ranks, the world size
# and the main address and port from SLURM's variables, and checks that ``--ntasks-per-node`` equals the
# devices. Its requeue (``auto_requeue=True``, the default when Lightning detects ``srun``) does not fit this
# repository's contract, so it is turned off:
#
# * it saves from inside the SIGUSR1 handler, wherever the signal lands: mid-backward, or in the middle of a
#   gradient-accumulation window whose gradients no checkpoint holds, so the resumed run would not match an
#   uninterrupted one;
# * it writes ``hpc_ckpt_<n>.ckpt`` beside the run (not ``checkpoints/last.ckpt``), and the requeued job loads
#   the newest one inside ``fit``, past the resume checks (resnorm_lm/train/resume.py);
# * it requeues at once and trains on until SLURM kills the job.
#
# Instead the warning signal (``--signal=USR1@90``) goes the way of a SIGTERM (resnorm_lm/train/preemption.py: a
# flag, a save of ``last.ckpt`` at the end of the current optimizer step, atomic, then out), and only then does
# rank 0 call ``scontrol requeue``. The requeued job runs the same command; a start with SLURM_RESTART_COUNT
# set continues the run from its ``last.ckpt`` (``resume_after_requeue``), with every resume check.
#
# A SIGTERM is not the warning: SLURM sends it for ``scancel``, the time limit and preemption alike, and only
# the site's preemption mode knows whether the job comes back. The run saves and stops as anywhere else, and
# says how to resume should it not.

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

"""The Lightning callbacks and the CSV logger a run trains with (the divergence guard's and preemption's callbacks live
with their rules): where an optimizer step ends under accumulation, checkpoints kept at good states, throughput
timed on logging steps only, the metrics.csv that a resumed run continues."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.callbacks import ModelCheckpoint, ThroughputMonitor
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from resnorm_lm.train.checkpoint_io import CheckpointWriteError
from resnorm_lm.train.divergence import has_diverged

# ---------------------------------------------------------------------------------------------------------------------
# Where an optimizer step ends under gradient accumulation, from Lightning's public properties.
#
# With ``accumulate_grad_batches`` k, Lightning runs the optimizer after every k-th training micro-batch of an
# epoch, and after the epoch's last one, where an unfinished window steps early (unless the strategy accumulates
# across epochs itself, as DeepSpeed does). The divergence guard must judge a step before its last backward, and
# the throughput monitor must act only at a step's end: both ask ``ends_optimizer_step``. The checkpoint and
# preemption callbacks, which act after the fact, see whether ``global_step`` moved (``StepBoundary``).
# ``tests/test_lightning_internals.py`` checks, on every micro-batch, that this agrees with Lightning's own rule.


def ends_optimizer_step(trainer: L.Trainer, batch_idx: int) -> bool:
    """Whether the optimizer steps after training micro-batch ``batch_idx`` (0-based within the epoch), as
    Lightning decides it; the same on every rank."""
    if (batch_idx + 1) % trainer.accumulate_grad_batches == 0:
        return True
    last_of_epoch = batch_idx + 1 == trainer.num_training_batches
    # a loader without a length: Lightning fetches one batch ahead and knows before this one runs
    last_of_epoch = last_of_epoch or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
    return last_of_epoch and not trainer.strategy.handles_gradient_accumulation


class StepBoundary(L.Callback):
    """Whether the training micro-batch that just ended also ended its optimizer step: Lightning moves
    ``global_step`` only on a window's last micro-batch. Mid-window, the accumulated gradients are in no
    checkpoint, and a resumed run would restart the data at the window's start."""

    step_at_batch_start = 0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.step_at_batch_start = trainer.global_step

    def ended_optimizer_step(self, trainer: L.Trainer) -> bool:
        return trainer.global_step != self.step_at_batch_start


# ---------------------------------------------------------------------------------------------------------------------
# The callbacks that write a run's checkpoints: periodic ones at good states only, and a final one.
#
# Both write through Lightning's ``trainer.save_checkpoint``, which the run's ``AtomicCheckpointIO``
# (``checkpoint_io.py``) turns into an atomic write; neither writes once the divergence guard has ended the run,
# so last.ckpt stays the last good state.


class GoodStateCheckpoint(StepBoundary, ModelCheckpoint):
    """A periodic ModelCheckpoint that never saves once the run has diverged.

    A bad step still counts as a global step (Lightning counts an optimizer step
    whose gradients were dropped, or that was masked on the device), so a plain
    ModelCheckpoint would save after it; this keeps last.ckpt at the last good state.
    Every hook at which ModelCheckpoint saves is passed over after a divergence.

    It saves at optimizer-step boundaries only. A plain ModelCheckpoint resumed at
    step N (a multiple of ``every_n_train_steps``) under gradient accumulation saves
    again after the first micro-batch of the next window, whose gradients no checkpoint
    holds: a run resumed from that file would not match an uninterrupted one.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.ended_optimizer_step(trainer) and not has_diverged(pl_module):
            super().on_train_batch_end(trainer, pl_module, *args)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not has_diverged(pl_module):
            super().on_train_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not has_diverged(pl_module):
            super().on_validation_end(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not has_diverged(pl_module):
            super().on_train_end(trainer, pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not has_diverged(pl_module) and not isinstance(exception, CheckpointWriteError):  # not on a full disk
            super().on_exception(trainer, pl_module, exception)


class FinalCheckpoint(L.Callback):
    """Saves last.ckpt when training ends at a step that is no multiple of run.checkpoint_every.

    Not after a divergence: there last.ckpt stays the last good state.
    """

    def __init__(self, checkpoint_path: Path, every: int) -> None:
        self.checkpoint_path, self.every = checkpoint_path, every

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if has_diverged(pl_module):
            return
        if trainer.global_step % self.every != 0:  # the same decision on every rank: saving is collective
            trainer.save_checkpoint(self.checkpoint_path, weights_only=False)  # full, resumable: said, not defaulted


# ---------------------------------------------------------------------------------------------------------------------
# Throughput logging that does not stall the GPU at every step.


def logs_this_step(trainer: L.Trainer) -> bool:
    """Whether Lightning logs the training metrics of the optimizer step that has just ended (its rule, from
    public properties): every ``log_every_n_steps`` steps, and the step at which the run stops."""
    every = trainer.log_every_n_steps
    return every > 0 and (trainer.global_step % every == 0 or trainer.should_stop)


class SparseThroughputMonitor(ThroughputMonitor):
    """Lightning's ThroughputMonitor, with its device sync on logging steps only.

    The parent synchronizes the GPU after every training batch to read an exact
    time: a full stall of the host's run-ahead at every step. Here a batch between
    logging steps is only counted (samples, lengths, batches: host integers), and
    the time is read, after a sync, on the steps whose metrics are logged anyway.
    Rates are differences of cumulative counts over differences of those times,
    so they stay exact; the window (``window_size``) counts logging steps.

    The counts are the parent's own (``_samples``, ``_batches``, ``_lengths``): Lightning has no public way to
    count a batch without timing it; tests/test_lightning_internals.py fails, naming them, when they move.
    """

    def syncs_device(self, trainer: L.Trainer) -> bool:
        return trainer.strategy.root_device.type == "cuda"

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, *args: Any
    ) -> None:
        logging_step = ends_optimizer_step(trainer, batch_idx) and logs_this_step(trainer)
        if logging_step or not self.syncs_device(trainer) or not trainer.is_global_zero:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx, *args)  # rank zero only
            return
        stage = trainer.state.stage
        self._samples[stage] += self.batch_size_fn(batch)
        self._batches[stage] += 1
        if self.length_fn is not None:
            self._lengths[stage] += self.length_fn(batch)


# ---------------------------------------------------------------------------------------------------------------------
# A CSVLogger that continues a resumed run's ``metrics.csv`` instead of deleting it.


def rows_up_to_step(path: Path, step: int) -> list[dict[str, Any]]:
    """The rows of a metrics.csv logged at or before ``step`` (later ones belong to the lost tail)."""
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return [{k: v for k, v in row.items() if v != ""} for row in rows if float(row.get("step") or 0) <= step]


class ContinuedCSVLogger(CSVLogger):
    """Writes ``<save_dir>/metrics.csv``; on resume from step k, keeps the earlier rows up to k.

    Lightning's CSVLogger deletes an existing metrics.csv; a resumed run should keep
    its history, minus the rows logged after the checkpoint it resumes from.
    """

    def __init__(self, save_dir: str | Path, resume_step: int | None = None) -> None:
        previous = rows_up_to_step(Path(save_dir) / "metrics.csv", resume_step) if resume_step is not None else []
        super().__init__(save_dir=str(save_dir), name="", version="")
        self._previous_rows = previous

    @property
    @rank_zero_experiment  # other ranks get Lightning's dummy experiment, which has every attribute (as a no-op)
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = RunMetricsWriter(log_dir=self.log_dir)
            self._experiment.metrics[:0] = self._previous_rows  # written before any new row, on the first save
            self._previous_rows = []
        return self._experiment


class RunMetricsWriter(ExperimentWriter):
    """Lightning's writer, in a run directory: it replaces the run's metrics.csv (a resumed run's earlier rows
    were read first) without Lightning's warning that the folder "exists and is not empty", which a run directory
    always is (its lock, its manifest, its config)."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            self._fs.rm_file(self.metrics_file_path)

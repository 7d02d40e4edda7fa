"""The callbacks that write a run's checkpoints: periodic ones at good states only, and a final one.

Both write through Lightning's ``trainer.save_checkpoint``, which the run's ``AtomicCheckpointIO``
(``checkpoint_io.py``) turns into an atomic write; neither writes once the divergence guard has ended the run,
so last.ckpt stays the last good state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from resnorm_lm.train.checkpoint_io import CheckpointWriteError
from resnorm_lm.train.divergence import has_diverged
from resnorm_lm.train.step_boundary import StepBoundary


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

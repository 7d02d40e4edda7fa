"""Throughput logging that does not stall the GPU at every step."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ThroughputMonitor

from resnorm_lm.train.step_boundary import ends_optimizer_step


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

"""Where an optimizer step ends under gradient accumulation, from Lightning's public properties.

With ``accumulate_grad_batches`` k, Lightning runs the optimizer after every k-th training micro-batch of an
epoch, and after the epoch's last one, where an unfinished window steps early (unless the strategy accumulates
across epochs itself, as DeepSpeed does). The divergence guard must judge a step before its last backward, and
the throughput monitor must act only at a step's end: both ask ``ends_optimizer_step``. The checkpoint and
preemption callbacks, which act after the fact, see whether ``global_step`` moved (``StepBoundary``).
``tests/test_lightning_internals.py`` checks, on every micro-batch, that this agrees with Lightning's own rule.
"""

from __future__ import annotations

from typing import Any

import lightning as L


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

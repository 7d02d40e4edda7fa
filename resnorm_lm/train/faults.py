"""Surviving faults: atomic checkpoint files, saving on SIGTERM, and catching divergence."""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from resnorm_lm.data.cache import atomic_write
from resnorm_lm.train.checkpoint_files import read_checkpoint_file


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint reader and writer, reading as data and writing all or nothing.

    Writes go through the project's one atomic writer (``resnorm_lm.data.cache.atomic_write``: a temp file in
    the same folder, fsync, rename, fsync of the folder): a process killed at any moment leaves either the
    previous complete file or the new complete file under the checkpoint's name, never a partial one. A leftover
    ``.tmp-*`` file is never taken for a checkpoint and is removed at the next start (``remove_temp_files``).

    Lightning reads checkpoints through this plugin too (resume): always as data,
    ``weights_only=True``, whatever Lightning asks (resnorm_lm/train/checkpoint_files.py).
    """

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        return read_checkpoint_file(path, map_location=map_location or "cpu")

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
        with atomic_write(path, "wb") as f:
            torch.save(checkpoint, f)


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


class StepBoundary(L.Callback):
    """Whether the training micro-batch that just ended also ended its optimizer step: Lightning moves
    ``global_step`` only on a window's last micro-batch. Mid-window, the accumulated gradients are in no
    checkpoint, and a resumed run would restart the data at the window's start."""

    step_at_batch_start = 0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.step_at_batch_start = trainer.global_step

    def ended_optimizer_step(self, trainer: L.Trainer) -> bool:
        return trainer.global_step != self.step_at_batch_start


def has_diverged(pl_module: L.LightningModule) -> bool:
    """Whether the module's divergence guard has ended the run (a module without one never diverges)."""
    guard = getattr(pl_module, "guard", None)
    return guard is not None and guard.diverged is not None


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
        if not has_diverged(pl_module):
            super().on_exception(trainer, pl_module, exception)


class Preempted(Exception):  # noqa: N818 (a request, not an error)
    """Raised once a SIGTERM's checkpoint and summary are written: the process exits 143 without more work."""


class PreemptOnSigterm(StepBoundary):
    """On SIGTERM (SLURM and most schedulers send it before SIGKILL), save last.ckpt and leave at once.

    The signal only sets a flag. At the end of the current optimizer step (with
    gradient accumulation: after the last micro-batch of the current window, whose
    gradients no checkpoint could hold), or after the current batch of a validation
    pass that follows a finished step, the callback writes last.ckpt atomically,
    calls ``on_preempted`` (which records the run as preempted and prints its
    RESULT line) and raises ``Preempted``: no end-of-run evaluation, no sample,
    so the process ends within one step plus one checkpoint write. A second
    SIGTERM or a SIGINT meanwhile exits at once; the checkpoint being written
    stays atomic (its temp file is removed at the next start). Under DDP the
    flag is shared across ranks every ``ddp_check_every`` optimizer steps (a
    collective and a host sync, so not at every step), at the same micro-batch
    on every rank, and all ranks stop at the same step.
    """

    def __init__(
        self, checkpoint_path: Path, on_preempted: Callable[[], None] = lambda: None, ddp_check_every: int = 10
    ) -> None:
        self.checkpoint_path = checkpoint_path
        self.on_preempted = on_preempted
        self.ddp_check_every = max(1, ddp_check_every)
        self.requested = False
        self.saved_at_step: int | None = None
        # whether the last training micro-batch ended its optimizer step; a run starts (or resumes) at a step
        self.at_step_boundary = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after Lightning registers its own handler (which would stop mid-validation without saving)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self.requested:  # asked twice: the user or scheduler wants out now
            os._exit(128 + signum)
        self.requested = True
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
            print(f"resnorm-lm: SIGTERM: saved {self.checkpoint_path} at step {trainer.global_step}; "
                  "continue with RESUME=last", flush=True)  # fmt: skip

    def _leave(self) -> None:
        self.on_preempted()
        raise Preempted(f"preempted at step {self.saved_at_step}")

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


@dataclass
class DivergenceConfig:
    """When a run counts as diverged, and what to do about a bad step."""

    factor: float = 4.0  # a loss above factor x its running minimum is bad (0: only NaN/Inf)
    on_bad_step: str = "stop"  # stop: end the run, keep the last good checkpoint; skip: skip the step
    max_skips: int = 10  # with on_bad_step=skip, this many skipped steps in a row count as divergence
    # where each optimizer step is judged (on its window of micro-batches on every rank: LossWindow).
    # host: read back before the last backward (a host sync every step), a bad step's gradients are
    # dropped. device: on the loss's device, the fused optimizer skips a bad step there, the verdict is
    # read back after the step is queued (resnorm_lm/train/device_verdicts.py). auto: device where the
    # optimizer is fused (CUDA) and no GradScaler (16-mixed) owns the optimizer's skip flag, else host.
    verdict: str = "auto"

    def __post_init__(self) -> None:
        if self.verdict not in ("auto", "host", "device"):
            raise ValueError(f"divergence.verdict must be 'auto', 'host' or 'device', got {self.verdict!r}")
        if self.on_bad_step not in ("stop", "skip"):
            raise ValueError(f"divergence.on_bad_step must be 'stop' or 'skip', got {self.on_bad_step!r}")
        if isinstance(self.max_skips, bool) or not isinstance(self.max_skips, int) or self.max_skips < 1:
            raise ValueError(f"divergence.max_skips must be an integer >= 1, got {self.max_skips!r}")
        if self.factor < 0 or (0 < self.factor <= 1):
            raise ValueError(f"divergence.factor must be > 1 (or 0 to check only NaN/Inf), got {self.factor}")


class LossWindow:
    """The training losses of one optimizer step: every micro-batch of its accumulation window, on every rank.

    A verdict is one decision for the whole step and for all ranks, so it is made on the step's worst loss
    (NaN if any loss was NaN) against the running minimum, which a good step lowers to its best loss. Both
    are kept on the loss's device as a (3,) summary, [any NaN, largest loss, -smallest loss] (NaNs left out
    of both), that micro-batches and ranks combine by an elementwise max: nothing is read back, and under
    DDP one small MAX all-reduce makes the summary the same on every rank.
    """

    def __init__(self) -> None:
        self.summary: torch.Tensor | None = None  # (3,) fp32 of the micro-batches since the last take()

    def add(self, loss: torch.Tensor) -> None:
        """Count a micro-batch's loss (0-dim tensor) in the window."""
        value = loss.detach().float()
        nan = torch.isnan(value)
        summary = torch.stack([nan.float(), torch.where(nan, -math.inf, value), torch.where(nan, -math.inf, -value)])
        self.summary = summary if self.summary is None else torch.maximum(self.summary, summary)

    def take(self) -> torch.Tensor:
        """The whole window's summary (3,), reduced over every rank; the next micro-batch starts a new window."""
        summary, self.summary = self.summary, None
        if summary is None:
            raise RuntimeError("LossWindow.take() before any loss was added: training_step judges its own losses")
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # not Lightning's strategy.reduce: it puts a barrier before the all-reduce, a host sync on NCCL
            dist.all_reduce(summary, op=dist.ReduceOp.MAX)
        return summary

    @staticmethod
    def extremes(summary: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The worst loss (NaN when any was NaN) and the best loss of a summary, as 0-dim tensors."""
        worst = torch.where(summary[0] > 0, torch.full_like(summary[1], math.nan), summary[1])
        return worst, -summary[2]


class DivergenceGuard:
    """Judges each optimizer step's training loss before the step is applied; keeps its verdicts across resume."""

    def __init__(self, config: DivergenceConfig) -> None:
        self.config = config
        self.running_min = math.inf
        self.skipped = 0  # bad steps skipped in total
        self.skipped_in_a_row = 0
        self.diverged: dict[str, Any] | None = None  # {"step": k, "reason": "..."} once diverged

    def bad_reason(self, loss: float, running_min: float | None = None) -> str | None:
        """Why ``loss`` is bad against ``running_min`` (default: this guard's), or None when it is not."""
        running_min = self.running_min if running_min is None else running_min
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if self.config.factor and loss > self.config.factor * running_min:
            return f"loss {loss:.4g} > {self.config.factor:g} x running minimum {running_min:.4g}"
        return None

    def judge(self, loss: float, step: int, *, best: float | None = None) -> str:
        """'ok', 'skip' (drop this step) or 'stop' (drop it and end the run).

        ``loss`` is the step's worst loss, ``best`` its best (default: ``loss``), which a good step
        brings into the running minimum (``LossWindow.extremes`` gives both).
        """
        reason = self.bad_reason(loss)
        if reason is None:
            self.running_min = min(self.running_min, loss if best is None else best)
            self.skipped_in_a_row = 0
            return "ok"
        if self.config.on_bad_step == "skip":
            self.skipped += 1
            self.skipped_in_a_row += 1
            if self.skipped_in_a_row < self.config.max_skips:
                return "skip"
            reason = f"{self.skipped_in_a_row} bad steps in a row (last: {reason})"
        self.diverged = {"step": step, "reason": reason}
        return "stop"

    def state_dict(self) -> dict[str, Any]:
        return {"running_min": self.running_min, "skipped": self.skipped, "skipped_in_a_row": self.skipped_in_a_row,
                "diverged": self.diverged}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.running_min = state["running_min"]
        self.skipped = state["skipped"]
        self.skipped_in_a_row = state["skipped_in_a_row"]
        self.diverged = state["diverged"]

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
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temp file in the same folder, fsyncs it, then renames it into place.

    A process killed at any moment leaves either the previous complete file or
    the new complete file under the checkpoint's name, never a partial one; a
    leftover ``.*.tmp-*`` file is never taken for a checkpoint and is removed at
    the next start (``remove_stale_temp_files``).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a power cut
        finally:
            os.close(dir_fd)


def remove_stale_temp_files(folder: Path) -> list[Path]:
    """Delete the temp files of checkpoint writes that were killed midway."""
    stale = list(folder.glob(".*.tmp-*")) if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


class FinalCheckpoint(L.Callback):
    """Saves last.ckpt when training ends at a step that is no multiple of run.checkpoint_every.

    Not after a divergence: there last.ckpt stays the last good state.
    """

    def __init__(self, checkpoint_path: Path, every: int) -> None:
        self.checkpoint_path, self.every = checkpoint_path, every

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        guard = getattr(pl_module, "guard", None)
        if guard is not None and guard.diverged is not None:
            return
        if trainer.global_step % self.every != 0:  # the same decision on every rank: saving is collective
            trainer.save_checkpoint(self.checkpoint_path)


class GoodStateCheckpoint(ModelCheckpoint):
    """A periodic ModelCheckpoint that never saves once the run has diverged.

    A bad step still counts as a global step (Lightning counts an optimizer step
    whose training_step returned None; a step masked on the device is a step), so
    a plain ModelCheckpoint would save after it; this keeps last.ckpt at the last
    good state.
    """

    def _should_skip_saving_checkpoint(self, trainer: L.Trainer) -> bool:
        guard = getattr(trainer.lightning_module, "guard", None)
        diverged = guard is not None and guard.diverged is not None
        return diverged or super()._should_skip_saving_checkpoint(trainer)


class Preempted(Exception):  # noqa: N818 (a request, not an error)
    """Raised once a SIGTERM's checkpoint and summary are written: the process exits 143 without more work."""


class PreemptOnSigterm(L.Callback):
    """On SIGTERM (SLURM and most schedulers send it before SIGKILL), save last.ckpt and leave at once.

    The signal only sets a flag. At the end of the current training step (or the
    current batch of a validation pass) the callback writes last.ckpt atomically,
    calls ``on_preempted`` (which records the run as preempted and prints its
    RESULT line) and raises ``Preempted``: no end-of-run evaluation, no sample,
    so the process ends within one step plus one checkpoint write. A second
    SIGTERM or a SIGINT meanwhile exits at once; the checkpoint being written
    stays atomic (its temp file is removed at the next start). Under DDP the
    flag is shared across ranks every ``ddp_check_every`` batches (a collective
    and a host sync, so not at every step), and all ranks stop at the same step.
    """

    def __init__(
        self, checkpoint_path: Path, on_preempted: Callable[[], None] = lambda: None, ddp_check_every: int = 10
    ) -> None:
        self.checkpoint_path = checkpoint_path
        self.on_preempted = on_preempted
        self.ddp_check_every = max(1, ddp_check_every)
        self.requested = False
        self.saved_at_step: int | None = None

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
        trainer.save_checkpoint(self.checkpoint_path)
        self.saved_at_step = trainer.global_step
        if trainer.is_global_zero:
            print(f"resnorm-lm: SIGTERM: saved {self.checkpoint_path} at step {trainer.global_step}; "
                  "continue with RESUME=last", flush=True)  # fmt: skip

    def _leave(self) -> None:
        self.on_preempted()
        raise Preempted(f"preempted at step {self.saved_at_step}")

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.saved_at_step is None and self._requested_on_any_rank(trainer, trainer.global_step):
            self._save(trainer)  # leave right after Lightning has logged this step's metrics:

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self.saved_at_step is not None:  # at the next batch,
            self._leave()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.saved_at_step is not None:  # before a validation pass would start,
            self._leave()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.saved_at_step is not None:  # or when that was the last step
            self._leave()

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int, *args) -> None:
        if trainer.sanity_checking or not self._requested_on_any_rank(trainer, batch_idx):
            return
        if trainer.state.fn == "fit":  # the weights are those of a finished step; after fit, last.ckpt is final
            self._save(trainer)
        self.saved_at_step = trainer.global_step
        self._leave()


@dataclass
class DivergenceConfig:
    """When a run counts as diverged, and what to do about a bad step."""

    factor: float = 4.0  # a loss above factor x its running minimum is bad (0: only NaN/Inf)
    on_bad_step: str = "stop"  # stop: end the run, keep the last good checkpoint; skip: skip the step
    max_skips: int = 10  # with on_bad_step=skip, this many skipped steps in a row count as divergence
    # where each loss is judged. host: read back before backward (a host sync every step). device: on
    # the loss's device, the fused optimizer skips a bad step there, the verdict is read back after the
    # step is queued (resnorm_lm/device_verdicts.py). auto: device where the optimizer is fused (CUDA)
    # and no GradScaler (16-mixed) owns the optimizer's skip flag, else host.
    verdict: str = "auto"

    def __post_init__(self) -> None:
        if self.verdict not in ("auto", "host", "device"):
            raise ValueError(f"divergence.verdict must be 'auto', 'host' or 'device', got {self.verdict!r}")
        if self.on_bad_step not in ("stop", "skip"):
            raise ValueError(f"divergence.on_bad_step must be 'stop' or 'skip', got {self.on_bad_step!r}")
        if self.factor < 0 or (0 < self.factor <= 1):
            raise ValueError(f"divergence.factor must be > 1 (or 0 to check only NaN/Inf), got {self.factor}")


class DivergenceGuard:
    """Judges each training loss before its optimizer step; keeps its verdicts across resume."""

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

    def judge(self, loss: float, step: int) -> str:
        """'ok', 'skip' (drop this step) or 'stop' (drop it and end the run)."""
        reason = self.bad_reason(loss)
        if reason is None:
            self.running_min = min(self.running_min, loss)
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

"""Judging each optimizer step on the loss's device, without a host sync before backward.

``DivergenceGuard`` reads the step's loss back before its last backward so that a bad
step is never applied. On a GPU that read waits for the forward pass and leaves the
GPU idle while the host then queues the backward. ``DeviceVerdicts`` keeps the guard's
rule and its guarantee without that wait:

* the verdict (NaN/Inf, or above ``factor`` x the running minimum; ``max_skips`` bad
  steps in a row) is computed on the loss's device from device state, on the step's
  ``LossWindow`` (every micro-batch of the accumulation window, reduced over the DDP
  ranks by an all-reduce on the device), so every rank reaches the same verdict;
* the fused optimizer skips a bad step on the device through its ``found_inf`` flag
  (torch's fused Adam/AdamW leave the weights, both moments and the step count as
  they were), so a bad step is never applied, whenever the host learns of it;
* a small report (the worst loss, the running minimum before and after it, bad,
  halted, bad steps in a row) is copied to the host without blocking, with an event;
  ``ReadVerdicts`` reads it at the end of the step, after the whole step is queued,
  waiting for the last forward pass at most, and brings the host guard's records up
  to date (skip counts, the divergence record, ``should_stop``), before any checkpoint
  of that step is written.

With ``on_bad_step: stop`` a bad step halts the device state: every later step is
masked too, so nothing is applied between the bad step and the host's reading. A
masked step counts as a global step (the LR schedule and the data position move
on), as a host-skipped one does.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from resnorm_lm.train.divergence import DivergenceGuard, LossWindow


class DeviceVerdicts:
    """The device-side twin of a host ``DivergenceGuard``, which it keeps up to date (the records live there)."""

    def __init__(self, guard: DivergenceGuard) -> None:
        self.guard = guard
        self.state: torch.Tensor | None = None  # (3,) fp32 on the loss's device: running min, in a row, halted
        self.mask: torch.Tensor | None = None  # () fp32: 1 when the optimizer step about to run must be skipped
        self.pending: list[tuple[int, torch.Tensor, torch.cuda.Event | None]] = []  # (step, host report, event)

    def _device_state(self, device: torch.device) -> torch.Tensor:
        if self.state is None or self.state.device != device:  # first step, or after a resume: from the host records
            g = self.guard
            halted = 1.0 if g.diverged is not None else 0.0
            self.state = torch.tensor([g.running_min, g.skipped_in_a_row, halted], dtype=torch.float32, device=device)
        return self.state

    def judge(self, window: torch.Tensor, step: int) -> None:
        """Queue the verdict on optimizer step ``step`` from its ``LossWindow`` summary (3,), all ranks reduced."""
        cfg = self.guard.config
        state = self._device_state(window.device)
        running_min, in_a_row, halted = state[0], state[1], state[2] > 0
        worst, best = LossWindow.extremes(window)  # () each
        bad = ~torch.isfinite(worst)
        if cfg.factor:
            bad = bad | (worst > cfg.factor * running_min)
        if cfg.on_bad_step == "skip":
            in_a_row = torch.where(bad, in_a_row + 1, torch.zeros_like(in_a_row))
            halted = halted | (in_a_row >= cfg.max_skips)
        else:
            halted = halted | bad
        new_min = torch.where(bad, running_min, torch.minimum(running_min, best))
        self.state = torch.stack([new_min, in_a_row, halted.float()])
        self.mask = (bad | halted).float()
        report = torch.stack([worst, running_min, new_min, bad.float(), halted.float(), in_a_row])  # (6,)
        self._send(step, report)

    def _send(self, step: int, report: torch.Tensor) -> None:
        if report.device.type != "cuda":
            self.pending.append((step, report, None))  # stack made a new tensor: nothing to copy
            return
        host = torch.empty(report.shape, dtype=report.dtype, pin_memory=True)
        host.copy_(report, non_blocking=True)
        event = torch.cuda.Event()
        event.record()  # right after the forward pass: waiting on it does not wait for the backward
        self.pending.append((step, host, event))

    def take_mask(self) -> torch.Tensor | None:
        """The skip flag of the optimizer step about to run (bad, or the run halted); resets it."""
        mask, self.mask = self.mask, None
        return mask

    def collect(self) -> bool:
        """Read back every queued report into the host guard; True once the run has diverged."""
        g = self.guard
        for step, host, event in self.pending:
            if event is not None:
                event.synchronize()
            loss, running_min, new_min, bad, halted, in_a_row = (float(v) for v in host.tolist())
            if bad:
                g.skipped += g.config.on_bad_step == "skip"  # as on the host: the last of max_skips counts too
                if g.diverged is None and halted:
                    reason = g.bad_reason(loss, running_min) or f"loss {loss:.4g} judged bad on the device"
                    if g.config.on_bad_step == "skip":
                        reason = f"{int(in_a_row)} bad steps in a row (last: {reason})"
                    g.diverged = {"step": step, "reason": reason}
            g.running_min = new_min
            g.skipped_in_a_row = int(in_a_row)
        self.pending.clear()
        return g.diverged is not None


class ReadVerdicts(L.Callback):
    """Reads the device verdicts back at the end of each training batch and stops a diverged run.

    A callback, not a LightningModule hook, so that it runs before the checkpoint callbacks
    (Lightning runs those last), which then know whether the step was good.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        verdicts: DeviceVerdicts | None = getattr(pl_module, "verdicts", None)
        if verdicts is not None and verdicts.collect():
            trainer.should_stop = True

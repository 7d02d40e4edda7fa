"""Catching divergence: when a step's loss counts as bad, and the guard that judges every optimizer step.

``DivergenceGuard`` judges each optimizer step by one rule computed on the loss's device; the verdict is applied
there (the fused optimizer skips a bad step) or read at once on the host (a bad step's gradients are dropped). A
step is judged whole: ``LossWindow`` gathers the losses of every micro-batch of its accumulation window on every
rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
import torch.distributed as dist


@dataclass
class DivergenceConfig:
    """When a run counts as diverged, and what to do about a bad step."""

    factor: float = 4.0  # a loss above factor x its running minimum is bad (0: only NaN/Inf)
    on_bad_step: str = "stop"  # stop: end the run, keep the last good checkpoint; skip: skip the step
    max_skips: int = 10  # with on_bad_step=skip, this many skipped steps in a row count as divergence
    # where each optimizer step is judged (on its window of micro-batches on every rank: LossWindow).
    # host: read back before the last backward (a host sync every step), a bad step's gradients are
    # dropped. device: the fused optimizer skips a bad step there, the verdict is read back after the step is
    # queued (``DivergenceGuard``). auto: device where the
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
    """Judges each optimizer step's training loss window before the step is applied: one rule, on the loss's
    device, whichever way the verdict is then applied; its records (the running minimum, skips, the divergence)
    live here and are kept across resume.

    ``judge`` computes the verdict from device state, without a host sync: bad when the window's worst loss is
    NaN/Inf or above ``factor`` x the running minimum (which a good step lowers to its best loss); the run halts
    at a bad step (``on_bad_step: stop``) or at ``max_skips`` bad steps in a row (``skip``). It leaves the skip
    flag of the step about to run (``take_mask``) and a small report, copied to the host without blocking.

    * On the device (``divergence.verdict: device``): the fused optimizer skips a bad step through the flag
      (torch's fused Adam/AdamW leave the weights, both moments and the step count as they were), and
      ``ReadVerdicts`` reads the reports at the end of the step, after the whole step is queued. A halted run
      masks every later step until the host has read it.
    * On the host (``host``): ``read`` waits for the report at once, before the last backward, and a bad step's
      gradients are dropped (for an optimizer that is not fused, or a GradScaler that owns the fused one's flag).

    A masked or dropped step counts as a global step (the LR schedule and the data position move on).
    """

    def __init__(self, config: DivergenceConfig) -> None:
        self.config = config
        self.running_min = math.inf
        self.skipped = 0  # bad steps skipped in total
        self.skipped_in_a_row = 0
        self.diverged: dict[str, Any] | None = None  # {"step": k, "reason": "..."} once diverged
        self.state: torch.Tensor | None = None  # (3,) fp32 on the loss's device: running min, in a row, halted
        self.mask: torch.Tensor | None = None  # () fp32: 1 when the optimizer step about to run must be skipped
        self.pending: list[tuple[int, torch.Tensor, torch.cuda.Event | None]] = []  # (step, host report, event)

    def judge(self, window: torch.Tensor, step: int) -> None:
        """Queue the verdict on optimizer step ``step`` from its ``LossWindow`` summary (3,), all ranks reduced."""
        cfg = self.config
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

    def read(self) -> str:
        """The host's way: the verdict on the step just judged, now (a host sync): 'ok', 'skip' (drop the step)
        or 'stop' (drop it and end the run)."""
        self.take_mask()
        _, host, _ = self.pending[-1]
        bad, halted = float(host[3]), float(host[4])
        self.collect()
        return "stop" if halted else "skip" if bad else "ok"

    def take_mask(self) -> torch.Tensor | None:
        """The skip flag of the optimizer step about to run (bad, or the run halted); resets it."""
        mask, self.mask = self.mask, None
        return mask

    def collect(self) -> bool:
        """Read back every queued report into the records; True once the run has diverged."""
        for step, host, event in self.pending:
            if event is not None:
                event.synchronize()
            loss, running_min, new_min, bad, halted, in_a_row = (float(v) for v in host.tolist())
            if bad:
                self.skipped += self.config.on_bad_step == "skip"  # the last of max_skips counts too
                if self.diverged is None and halted:
                    reason = self.bad_reason(loss, running_min)
                    if self.config.on_bad_step == "skip":
                        reason = f"{int(in_a_row)} bad steps in a row (last: {reason})"
                    self.diverged = {"step": step, "reason": reason}
            self.running_min = new_min
            self.skipped_in_a_row = int(in_a_row)
        self.pending.clear()
        return self.diverged is not None

    def bad_reason(self, loss: float, running_min: float) -> str:
        """Why a bad step's ``loss`` was bad against ``running_min``, in words."""
        if not math.isfinite(loss):
            return f"loss is {loss}"
        return f"loss {loss:.4g} > {self.config.factor:g} x running minimum {running_min:.4g}"

    def _device_state(self, device: torch.device) -> torch.Tensor:
        if self.state is None or self.state.device != device:  # first step, or after a resume: from the records
            halted = 1.0 if self.diverged is not None else 0.0
            values = [self.running_min, self.skipped_in_a_row, halted]
            self.state = torch.tensor(values, dtype=torch.float32, device=device)
        return self.state

    def _send(self, step: int, report: torch.Tensor) -> None:
        if report.device.type != "cuda":
            self.pending.append((step, report, None))  # stack made a new tensor: nothing to copy
            return
        host = torch.empty(report.shape, dtype=report.dtype, pin_memory=True)
        host.copy_(report, non_blocking=True)
        event = torch.cuda.Event()
        event.record()  # right after the forward pass: waiting on it does not wait for the backward
        self.pending.append((step, host, event))

    def state_dict(self) -> dict[str, Any]:
        return {
            "running_min": self.running_min,
            "skipped": self.skipped,
            "skipped_in_a_row": self.skipped_in_a_row,
            "diverged": self.diverged,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.running_min = state["running_min"]
        self.skipped = state["skipped"]
        self.skipped_in_a_row = state["skipped_in_a_row"]
        self.diverged = state["diverged"]
        self.state = None  # rebuilt from these records at the next step


class ReadVerdicts(L.Callback):
    """Reads the device verdicts back at the end of each training batch and stops a diverged run.

    A callback, not a LightningModule hook, so that it runs before the checkpoint callbacks
    (Lightning runs those last), which then know whether the step was good.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        guard: DivergenceGuard | None = getattr(pl_module, "guard", None)
        if guard is not None and guard.collect():
            trainer.should_stop = True


def has_diverged(pl_module: L.LightningModule) -> bool:
    """Whether the module's divergence guard has ended the run (a module without one never diverges)."""
    guard = getattr(pl_module, "guard", None)
    return guard is not None and guard.diverged is not None

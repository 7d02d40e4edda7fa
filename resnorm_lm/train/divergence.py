"""Catching divergence: when a step's loss counts as bad, and the guard that judges every optimizer step.

``DivergenceGuard`` judges each step on the host before its last backward (a bad step's gradients are dropped);
``divergence_on_device.py`` holds its device-side twin, which judges without a host sync. Both judge a step whole:
``LossWindow`` gathers the losses of every micro-batch of its accumulation window on every rank.
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
    # dropped. device: on the loss's device, the fused optimizer skips a bad step there, the verdict is
    # read back after the step is queued (resnorm_lm/train/divergence_on_device.py). auto: device where the
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


def has_diverged(pl_module: L.LightningModule) -> bool:
    """Whether the module's divergence guard has ended the run (a module without one never diverges)."""
    guard = getattr(pl_module, "guard", None)
    return guard is not None and guard.diverged is not None

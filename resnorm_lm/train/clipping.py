"""Gradient clipping by global norm, with a record of how often it bound.

Clipping at 1.0 binds for one placement and hardly for another (a step-0 gradient norm of about 1 per block
under pre-norm, about 0.03 under post-norm), so the early effective step differs by placement. The record says
how often it did: the steps taken and the steps whose pre-clip global norm exceeded the bound, counted on the
gradients' device (no host sync per step) and kept in checkpoints, so a resumed run counts on.
"""

from __future__ import annotations

import torch


class ClipRecord:
    """Counts of optimizer steps with clipping on, and of those whose pre-clip norm exceeded the bound."""

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None  # (2,) int64 on the gradients' device: [steps, clipped steps]
        self.max_norm: float | None = None  # the bound of the last recorded step

    def clip(self, params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
        """Clip the gradients of ``params`` to global norm ``max_norm`` (torch's rule) and record the step; returns
        the pre-clip norm (0-dim, on the device)."""
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        # torch scales by max_norm / (total + 1e-6) where that is below 1: the clip binds where total exceeds this
        bound = (total + 1e-6 > max_norm).long()
        step = torch.stack([torch.ones_like(bound), bound])  # (2,)
        self.counts = step if self.counts is None else self.counts.to(step.device) + step  # .to: once, after a load
        self.max_norm = float(max_norm)
        return total

    def summary(self) -> dict | None:
        """``{"max_norm", "steps", "clipped_steps", "clipped_fraction"}`` (one host read), or None where no step
        was clipped by norm."""
        if self.counts is None:
            return None
        steps, clipped = self.counts.tolist()
        return {
            "max_norm": self.max_norm,
            "steps": steps,
            "clipped_steps": clipped,
            "clipped_fraction": clipped / steps if steps else 0.0,
        }

    def state_dict(self) -> dict:
        return {"counts": None if self.counts is None else self.counts.cpu().tolist(), "max_norm": self.max_norm}

    def load_state_dict(self, state: dict) -> None:
        counts = state.get("counts")
        self.counts = None if counts is None else torch.tensor(counts, dtype=torch.long)
        self.max_norm = state.get("max_norm")

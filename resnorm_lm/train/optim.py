"""AdamW parameter groups and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class OptimConfig:
    """Optimizer and schedule. Recipes change warmup; profiles change the rest."""

    lr: float = 1e-3  # peak learning rate, reached at the end of warmup
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at max_steps
    warmup_steps: int = 100  # linear warmup from 0 (0: start at the peak)
    weight_decay: float = 0.1  # decoupled, on weight matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"optim.{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0:
            raise ValueError(f"optim.eps must be > 0 (it keeps AdamW's update finite), got {self.eps}")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay the matrices of linear layers and the token embedding (tied to the LM head);
    not norms, biases, scalars (ReZero gates, DyT alpha) or the position table, whose
    rows for late positions are rarely updated early in training."""
    decay, no_decay = [], []
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        is_matrix = p.ndim >= 2 and "wpe" not in name.split(".")
        (decay if is_matrix else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def warmup_cosine(step: int, *, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak LR at ``step``: linear warmup from 0, then cosine to ``min_lr_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr_ratio
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


FUSED_ADAMW_DEVICES = ("cuda", "cpu")  # where torch has a fused AdamW kernel


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, max_steps: int, fused: bool | None = None
) -> tuple[torch.optim.Optimizer, object]:
    """AdamW over ``parameter_groups`` and a per-step LambdaLR of ``warmup_cosine``.

    ``fused`` (default: on CUDA and CPU) runs one fused kernel per step instead of a Python loop over tensors: on
    the cpu profile's 148 tensors about 4x less time per step (docs/benchmarks.md).
    """
    if max_steps is None or max_steps <= 0:
        raise ValueError("the cosine schedule needs --trainer.max_steps > 0 (the profiles set it)")
    if cfg.warmup_steps >= max_steps:
        peak = max_steps / cfg.warmup_steps
        warnings.warn(f"optim.warmup_steps ({cfg.warmup_steps}) is not below the run's {max_steps} steps: the LR "
                      f"rises for the whole run to {peak:.0%} of its peak and never decays. For warmup then "
                      f"cosine, set --model.optim.warmup_steps below {max_steps}.", stacklevel=2)  # fmt: skip
    if fused is None:
        fused = all(p.device.type in FUSED_ADAMW_DEVICES for p in model.parameters())
    optimizer = torch.optim.AdamW(
        parameter_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=True if fused else None,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: warmup_cosine(
            step, warmup_steps=cfg.warmup_steps, max_steps=max_steps, min_lr_ratio=cfg.min_lr_ratio
        ),
    )
    return optimizer, schedule

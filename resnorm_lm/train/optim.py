"""AdamW parameter groups, and the optimizer with its learning-rate schedule (``schedules.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from resnorm_lm.train.schedules import SCHEDULES

DEFAULT_COOLDOWN_FRACTION = 0.2  # Hagele et al. 2024: a 20% cooldown matches cosine at equal length


@dataclass
class OptimConfig:
    """Optimizer and schedule. Recipes and tuned overlays change lr and warmup; profiles change the rest.

    Warmup and cooldown are fractions of the run (``trainer.max_steps``), so the schedule's shape does not depend
    on the run's length (``resnorm_lm/train/schedules.py``)."""

    lr: float = 1e-3  # peak learning rate, reached at the end of warmup
    schedule: str = "cosine"  # cosine | wsd | constant (resnorm_lm/train/schedules.py)
    warmup_fraction: float = 0.1  # linear warmup over this fraction of the run (0: start at the peak)
    cooldown_fraction: float = DEFAULT_COOLDOWN_FRACTION  # wsd only: the final decay over this fraction of the run
    min_lr_ratio: float = 0.1  # the LR the decay ends at, as a fraction of the peak (cosine, wsd)
    weight_decay: float = 0.1  # decoupled, on weight matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        schedule = SCHEDULES.get(self.schedule)
        if not self.warmup_fraction >= 0:
            raise ValueError(f"optim.warmup_fraction must be >= 0 (a fraction of the run), got {self.warmup_fraction}")
        if self.warmup_fraction >= 1 and not schedule.warmup_may_pass_end:
            raise ValueError(
                f"optim.warmup_fraction {self.warmup_fraction:g} reaches the end of the run: under schedule "
                f"{self.schedule!r} the LR would never reach its peak nor decay. Use a fraction below 1, or ask for "
                "a whole-run ramp by name: --model.optim.schedule=constant"
            )
        if not 0 < self.cooldown_fraction <= 1:
            raise ValueError(f"optim.cooldown_fraction must be in (0, 1], got {self.cooldown_fraction}")
        default_cooldown = DEFAULT_COOLDOWN_FRACTION
        if not schedule.has_cooldown and self.cooldown_fraction != default_cooldown:
            with_cooldown = [name for name in SCHEDULES.names() if SCHEDULES.get(name).has_cooldown]
            raise ValueError(
                f"optim.cooldown_fraction={self.cooldown_fraction:g} would change nothing under schedule "
                f"{self.schedule!r}: leave it at {default_cooldown:g}, or use schedule {' or '.join(with_cooldown)}"
            )
        if schedule.has_cooldown and self.warmup_fraction + self.cooldown_fraction >= 1:
            raise ValueError(
                f"optim.warmup_fraction {self.warmup_fraction:g} plus cooldown_fraction {self.cooldown_fraction:g} "
                "leave no part of the run at the peak: their sum must be below 1"
            )
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


FUSED_ADAMW_DEVICES = ("cuda", "cpu")  # where torch has a fused AdamW kernel


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, max_steps: int, fused: bool | None = None
) -> tuple[torch.optim.Optimizer, object]:
    """AdamW over ``parameter_groups`` and a per-step LambdaLR of the configured schedule over ``max_steps``.

    ``fused`` (default: on CUDA and CPU) runs one fused kernel per step instead of a Python loop over tensors: on
    the cpu profile's 148 tensors about 4x less time per step (docs/benchmarks.md).
    """
    if max_steps is None or max_steps <= 0:
        raise ValueError("the LR schedule needs --trainer.max_steps > 0 (the profiles set it)")
    multiplier = build_schedule(cfg, max_steps)
    if fused is None:
        fused = all(p.device.type in FUSED_ADAMW_DEVICES for p in model.parameters())
    optimizer = torch.optim.AdamW(
        parameter_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=True if fused else None,
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)


def build_schedule(cfg: OptimConfig, max_steps: int):
    """The configured schedule over a run of ``max_steps``: step -> multiplier of the peak LR."""
    return SCHEDULES.get(cfg.schedule)(max_steps, cfg.warmup_fraction, cfg.min_lr_ratio, cfg.cooldown_fraction)

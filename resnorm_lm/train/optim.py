"""The optimizer and its learning-rate schedule: AdamW's parameter groups, and the schedules by name."""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

import torch
from torch import nn

from resnorm_lm.registry import Registry

DEFAULT_COOLDOWN_FRACTION = 0.2  # Hagele et al. 2024: a 20% cooldown matches cosine at equal length


@dataclass
class OptimConfig:
    """Optimizer and schedule. Recipes and tuned overlays change lr and warmup; profiles change the rest.

    Warmup and cooldown are fractions of the run (``trainer.max_steps``), so the schedule's shape does not depend
    on the run's length (``resnorm_lm/train/optim.py``)."""

    lr: float = 1e-3  # peak learning rate, reached at the end of warmup
    schedule: str = "cosine"  # cosine | wsd | constant (resnorm_lm/train/optim.py)
    warmup_fraction: float = 0.1  # linear warmup over this fraction of the run (0: start at the peak)
    cooldown_fraction: float = DEFAULT_COOLDOWN_FRACTION  # wsd only: the final decay over this fraction of the run
    min_lr_ratio: float = 0.1  # the LR the decay ends at, as a fraction of the peak (cosine, wsd)
    weight_decay: float = 0.1  # decoupled, on weight matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    # {name pattern: factor}: the parameters whose names match (fnmatch, e.g. "*.query") train at factor x lr, on
    # the same schedule (0 freezes them); None: every parameter at lr. A probe's knob, never a recipe's default.
    lr_multipliers: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        for pattern, factor in (self.lr_multipliers or {}).items():
            if not factor >= 0:
                raise ValueError(
                    f"optim.lr_multipliers[{pattern!r}] must be >= 0 (a factor of lr; 0 freezes them), got {factor}"
                )
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


def parameter_groups(
    model: nn.Module, weight_decay: float, lr: float | None = None, lr_multipliers: dict[str, float] | None = None
) -> list[dict]:
    """Decay the matrices of linear layers and the token embedding (tied to the LM head);
    not norms, biases, scalars (ReZero gates, DyT alpha), the position table, whose
    rows for late positions are rarely updated early in training, or the static parts of
    hyper-connections (``static_*``: their paper, arXiv 2409.19606 section 4, decays only the dynamic ones).

    With ``lr_multipliers`` ({fnmatch pattern of a parameter's name: factor}), the parameters a pattern matches
    (the first that does) get groups of their own at factor x ``lr``; a pattern that matches nothing is an error."""
    lr_multipliers = lr_multipliers or {}
    if lr_multipliers and lr is None:
        raise ValueError("parameter_groups: lr_multipliers need the base lr")
    groups: dict[tuple[bool, str | None], list[nn.Parameter]] = {(True, None): [], (False, None): []}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        parts = name.split(".")
        is_matrix = p.ndim >= 2 and "wpe" not in parts and not parts[-1].startswith("static_")
        pattern = next((pat for pat in lr_multipliers if fnmatch.fnmatchcase(name, pat)), None)
        groups.setdefault((is_matrix, pattern), []).append(p)
    unmatched = [pat for pat in lr_multipliers if not any(key[1] == pat for key in groups)]
    if unmatched:
        names = ", ".join(name for name, _ in model.named_parameters())
        raise ValueError(
            f"optim.lr_multipliers: no parameter's name matches {', '.join(map(repr, unmatched))} (fnmatch "
            f"patterns over names such as {names[:300]}...)"
        )
    out = []
    for (is_matrix, pattern), params in groups.items():
        group = {"params": params, "weight_decay": weight_decay if is_matrix else 0.0}
        if pattern is not None:
            group["lr"] = lr * lr_multipliers[pattern]
        if params or pattern is None:  # the two plain groups always, as before
            out.append(group)
    return out


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
        parameter_groups(model, cfg.weight_decay, cfg.lr, cfg.lr_multipliers),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=True if fused else None,
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)


def build_schedule(cfg: OptimConfig, max_steps: int):
    """The configured schedule over a run of ``max_steps``: step -> multiplier of the peak LR."""
    return SCHEDULES.get(cfg.schedule)(max_steps, cfg.warmup_fraction, cfg.min_lr_ratio, cfg.cooldown_fraction)


# ---------------------------------------------------------------------------------------------------------------------
# Learning-rate schedules by name: the multiplier of the peak LR at each optimizer step.
#
# Warmup and cooldown are fractions of the run, so a schedule has the same shape at 500 steps and at 2000: a tuned
# ``warmup_fraction`` means the same thing whatever ``max_steps`` is (a warmup in steps would be 40% of one run and
# 10% of another). Steps are ``round(fraction * max_steps)``.
#
#     cosine     linear warmup, then cosine down to ``min_lr_ratio`` at the last step (GPT-3, Chinchilla, nanoGPT)
#     wsd        warmup-stable-decay: linear warmup, the peak held, then a (1 - sqrt) cooldown over the last
#                ``cooldown_fraction`` of the run to ``min_lr_ratio`` (Hagele et al. 2024, arXiv 2405.18392: with a
#                20% cooldown it matches cosine at equal length, and (1 - sqrt) beats a linear cooldown; MiniCPM,
#                arXiv 2404.06395)
#     constant   linear warmup, then the peak held to the end; the one schedule whose warmup may reach past the end
#                of the run (``warmup_fraction >= 1``: the LR rises the whole run and never reaches its peak), so
#                such a ramp is asked for by this name and never happens by accident
#
# A warmup that reaches the end of the run under ``cosine`` or ``wsd`` is refused when the config is read.

SCHEDULES: Registry[type[Schedule]] = Registry("schedule")


class Schedule:
    """``multiplier(step)``: the fraction of the peak LR at optimizer step ``step`` (0-based) of a run of
    ``total_steps``. The warmup rises linearly from ``1 / warmup_steps`` at step 0 to 1 at its last step."""

    warmup_may_pass_end = False  # only a schedule asked for by name may warm up for the whole run
    has_cooldown = False  # reads cooldown_fraction

    def __init__(self, total_steps: int, warmup_fraction: float, min_lr_ratio: float, cooldown_fraction: float) -> None:
        if total_steps < 1:
            raise ValueError(f"the LR schedule needs --trainer.max_steps >= 1, got {total_steps}")
        self.total_steps, self.min_lr_ratio = total_steps, min_lr_ratio
        self.warmup_steps = round(warmup_fraction * total_steps)
        self.cooldown_steps = round(cooldown_fraction * total_steps) if self.has_cooldown else 0
        if self.warmup_steps + self.cooldown_steps >= total_steps and not self.warmup_may_pass_end:
            cooldown = f" plus its {self.cooldown_steps}-step cooldown" if self.cooldown_steps else ""
            raise ValueError(
                f"a warmup of {self.warmup_steps} steps (warmup_fraction {warmup_fraction:g}){cooldown} reaches the "
                f"end of a {total_steps}-step run, so the LR would never settle at its peak nor decay; use a "
                "smaller --model.optim.warmup_fraction, or ask for a whole-run ramp by name: "
                "--model.optim.schedule=constant"
            )

    def warmup(self, step: int) -> float | None:
        """The warmup's multiplier, or None after the warmup."""
        return (step + 1) / self.warmup_steps if step < self.warmup_steps else None

    def __call__(self, step: int) -> float:
        raise NotImplementedError


@SCHEDULES.register("cosine")
class WarmupCosine(Schedule):
    """Linear warmup, then cosine from the peak to ``min_lr_ratio`` x peak at the last step, held after it."""

    def __call__(self, step: int) -> float:
        rising = self.warmup(step)
        if rising is not None:
            return rising
        if step >= self.total_steps:
            return self.min_lr_ratio
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@SCHEDULES.register("wsd")
class WarmupStableDecay(Schedule):
    """Linear warmup, the peak held, then over the last ``cooldown_steps`` a (1 - sqrt(t)) decay towards
    ``min_lr_ratio`` x peak, t = (step - cooldown start) / cooldown_steps (Hagele et al.'s code: the first cooldown
    step is at the peak, the last one just above the floor, which is reached after it)."""

    has_cooldown = True

    def __call__(self, step: int) -> float:
        rising = self.warmup(step)
        if rising is not None:
            return rising
        start = self.total_steps - self.cooldown_steps
        if step < start:
            return 1.0
        t = min(1.0, (step - start) / max(1, self.cooldown_steps))  # a run too short to round its cooldown above 0
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * (1 - math.sqrt(t))


@SCHEDULES.register("constant")
class WarmupConstant(Schedule):
    """Linear warmup, then the peak to the end. With ``warmup_fraction >= 1`` the warmup outlasts the run: the LR
    rises throughout to ``1 / warmup_fraction`` of the peak (a ramp)."""

    warmup_may_pass_end = True

    def __call__(self, step: int) -> float:
        rising = self.warmup(step)
        return 1.0 if rising is None else rising

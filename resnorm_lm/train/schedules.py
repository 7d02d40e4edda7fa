"""Learning-rate schedules by name: the multiplier of the peak LR at each optimizer step.

Warmup and cooldown are fractions of the run, so a schedule has the same shape at 500 steps and at 2000: a tuned
``warmup_fraction`` means the same thing whatever ``max_steps`` is (a warmup in steps would be 40% of one run and
10% of another). Steps are ``round(fraction * max_steps)``.

    cosine     linear warmup, then cosine down to ``min_lr_ratio`` at the last step (GPT-3, Chinchilla, nanoGPT)
    wsd        warmup-stable-decay: linear warmup, the peak held, then a (1 - sqrt) cooldown over the last
               ``cooldown_fraction`` of the run to ``min_lr_ratio`` (Hagele et al. 2024, arXiv 2405.18392: with a
               20% cooldown it matches cosine at equal length, and (1 - sqrt) beats a linear cooldown; MiniCPM,
               arXiv 2404.06395)
    constant   linear warmup, then the peak held to the end; the one schedule whose warmup may reach past the end
               of the run (``warmup_fraction >= 1``: the LR rises the whole run and never reaches its peak), so
               such a ramp is asked for by this name and never happens by accident

A warmup that reaches the end of the run under ``cosine`` or ``wsd`` is refused when the config is read.
"""

from __future__ import annotations

import math

from resnorm_lm.registry import Registry

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
        t = min(1.0, (step - start) / self.cooldown_steps)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * (1 - math.sqrt(t))


@SCHEDULES.register("constant")
class WarmupConstant(Schedule):
    """Linear warmup, then the peak to the end. With ``warmup_fraction >= 1`` the warmup outlasts the run: the LR
    rises throughout to ``1 / warmup_fraction`` of the peak (a ramp)."""

    warmup_may_pass_end = True

    def __call__(self, step: int) -> float:
        rising = self.warmup(step)
        return 1.0 if rising is None else rising

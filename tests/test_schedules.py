"""The LR schedules: warmup and cooldown as fractions of the run, and the refusals of a warmup that reaches its end."""

from __future__ import annotations

import math

import pytest
import torch

from resnorm_lm.train.optim import OptimConfig, build_optimizer, build_schedule


def multipliers(steps: int, **optim) -> list[float]:
    schedule = build_schedule(OptimConfig(**optim), steps)
    return [schedule(s) for s in range(steps + 5)]


def test_the_same_fractions_give_the_same_shape_at_every_length():
    for name in ("cosine", "wsd", "constant"):
        short = multipliers(500, schedule=name, warmup_fraction=0.25, min_lr_ratio=0.0)
        long = multipliers(2000, schedule=name, warmup_fraction=0.25, min_lr_ratio=0.0)
        for fraction in (0.1, 0.25, 0.5, 0.79, 0.9, 0.99):  # the same point of the run, in steps of each
            assert short[round(fraction * 500)] == pytest.approx(long[round(fraction * 2000)], abs=0.01), name


def test_warmup_then_cosine_to_the_floor():
    lr = multipliers(110, schedule="cosine", warmup_fraction=10 / 110, min_lr_ratio=0.1)
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0)  # 10 warmup steps: 1/10 .. 10/10
    assert lr[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr[110] == pytest.approx(0.1) and lr[114] == pytest.approx(0.1)  # held at the floor after the run
    assert all(a >= b for a, b in zip(lr[9:], lr[10:]))
    assert multipliers(10, schedule="cosine", warmup_fraction=0.0, min_lr_ratio=0.0)[0] == pytest.approx(1.0)


def test_wsd_holds_the_peak_then_cools_down_as_one_minus_sqrt():
    lr = multipliers(500, schedule="wsd", warmup_fraction=0.2, cooldown_fraction=0.2, min_lr_ratio=0.0)
    assert lr[0] == pytest.approx(1 / 100) and lr[99] == pytest.approx(1.0)  # warmup: 100 steps
    assert lr[100:401] == [1.0] * 301  # stable to the cooldown's first step (400 = 500 - 100)
    for step in (425, 450, 499):
        assert lr[step] == pytest.approx(1 - math.sqrt((step - 400) / 100))
    assert lr[499] > 0 and lr[500] == 0.0  # the last step just above the floor, reached after it
    floor = multipliers(500, schedule="wsd", warmup_fraction=0.2, min_lr_ratio=0.1)
    assert floor[450] == pytest.approx(0.1 + 0.9 * (1 - math.sqrt(0.5))) and floor[503] == pytest.approx(0.1)
    # a run so short that its cooldown rounds to 0 steps (0.2 of 2): the peak to the end, and past it no error
    assert multipliers(2, schedule="wsd", warmup_fraction=0.0, cooldown_fraction=0.2)[:3] == [1.0, 1.0, 1.0]


def test_a_warmup_that_reaches_the_end_of_the_run_is_refused_unless_asked_for_by_name():
    for name in ("cosine", "wsd"):
        with pytest.raises(ValueError, match=r"warmup_fraction 1\.6 reaches the end of the run.*schedule=constant"):
            OptimConfig(schedule=name, warmup_fraction=1.6)
    with pytest.raises(ValueError, match="warmup_fraction 0.9 plus cooldown_fraction 0.2 leave no part"):
        OptimConfig(schedule="wsd", warmup_fraction=0.9)
    with pytest.raises(ValueError, match="a warmup of 4 steps .*reaches the end of a 4-step run"):
        build_schedule(OptimConfig(schedule="cosine", warmup_fraction=0.9), 4)  # 0.9 of 4 steps rounds to 4
    ramp = multipliers(500, schedule="constant", warmup_fraction=1.6)  # a whole-run ramp, by its name
    assert ramp[499] == pytest.approx(500 / 800) and all(a < b for a, b in zip(ramp[:499], ramp[1:500]))
    assert multipliers(10, schedule="constant", warmup_fraction=0.5)[5:10] == [1.0] * 5


def test_schedule_settings_that_nothing_reads_and_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown schedule 'linear'; valid schedules: constant, cosine, wsd"):
        OptimConfig(schedule="linear")
    with pytest.raises(ValueError, match="cooldown_fraction=0.3 would change nothing under schedule 'cosine'"):
        OptimConfig(schedule="cosine", cooldown_fraction=0.3)
    with pytest.raises(ValueError, match="warmup_fraction must be >= 0"):
        OptimConfig(warmup_fraction=-0.1)


def test_restating_a_warmup_of_steps_as_its_fraction_changes_no_step_of_the_schedule():
    """The tuned overlays were restated from steps to fractions: 200 of 500 steps is 0.4, step for step what the
    step-counted warmup gave (linear to its 200th step, then cosine over the other 300)."""
    lr = multipliers(500, schedule="cosine", warmup_fraction=200 / 500, min_lr_ratio=0.1)
    progress = [(s - 200) / 300 for s in range(500)]  # the step-counted schedule's own arithmetic, exactly
    old = [
        (s + 1) / 200 if s < 200 else 0.1 + (1 - 0.1) * 0.5 * (1 + math.cos(math.pi * progress[s])) for s in range(500)
    ]
    assert lr[:500] == old


def test_the_optimizer_steps_the_configured_schedule():
    model = torch.nn.Linear(4, 4)
    optimizer, schedule = build_optimizer(model, OptimConfig(lr=1e-2, schedule="wsd", warmup_fraction=0.1), 100)
    seen = []
    for _ in range(100):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert seen[0] == pytest.approx(1e-3) and seen[50] == pytest.approx(1e-2)
    assert seen[99] == pytest.approx(1e-2 * (0.1 + 0.9 * (1 - math.sqrt(0.95))))  # 19 of the cooldown's 20 steps

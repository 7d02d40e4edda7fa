"""The global gradient norm over training at a suite's picks: the suite table's gradient part.

Every run logs the global gradient norm before clipping (``grad_norm/total``, at each logged step) and records in
eval.json how many optimizer steps the clip bound (``clip``). OLMo 2 claims that its reordered norm with QK-norm
curbs the growth of the gradient norm and its spikes (arXiv 2501.00656); QK-norm is set against the growth of the
attention logits at high LRs (Wortsman et al. 2023, arXiv 2309.14322). For each recipe, over the pick's fresh seeds
that learned: the norm at the first logged step (early in the warmup, where a norm whose input is below its eps
scales the gradient up), its median and its largest value over the second half of the run (growth, a spike), and
the fraction of steps the clip bound; median (min..max) over the seeds, as the norms span orders of magnitude.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from resnorm_lm.analysis.evidence import spread
from resnorm_lm.train.diagnostics import GRAD_NORM_TOTAL
from resnorm_lm.train.runs import RunDir

if TYPE_CHECKING:
    from pathlib import Path

    from resnorm_lm.analysis.suite_report import TunedReport


def norm_trace(run_dir: Path) -> list[tuple[int, float]]:
    """[(step, global gradient norm before clipping)] from a run's metrics.csv."""
    return [
        (int(row.get("step", 0)), row[GRAD_NORM_TOTAL]) for row in RunDir(run_dir).metrics() if GRAD_NORM_TOTAL in row
    ]


def second_half(trace: list[tuple[int, float]]) -> list[float]:
    """The norms logged from the middle of the run on."""
    end = trace[-1][0]
    return [norm for step, norm in trace if step >= end / 2]


def clipped_fraction(run_dir: Path) -> float | None:
    clip = RunDir(run_dir).summary().get("clip") or {}
    return clip.get("clipped_fraction")


def gradient_rows(report: TunedReport) -> list[dict[str, Any]]:
    """One row per recipe whose pick's fresh seeds that learned log the global gradient norm (see the module's
    docstring)."""
    rows = []
    for recipe in report.suite.recipes:
        traces = [(run, t) for run in report.learned_runs(recipe) if (t := norm_trace(run))]
        if not traces:
            continue
        clipped = [c for run, _ in traces if (c := clipped_fraction(run)) is not None]
        rows.append(
            {
                "recipe": recipe,
                "seeds": len(traces),
                "first": spread([t[0][1] for _, t in traces]),
                "late_median": spread([statistics.median(second_half(t)) for _, t in traces]),
                "late_max": spread([max(second_half(t)) for _, t in traces]),
                "clipped": spread(clipped),
            }
        )
    return rows


def gradient_table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown of ``gradient_rows``; nothing where no recipe logs the global gradient norm."""
    if not rows:
        return []
    lines = [
        "",
        "Gradient norm (the same seeds): the global norm of the gradient before clipping, median (min..max) over the "
        "seeds: at the first logged step, early in the warmup; its median and its largest value over the second half "
        "of the run; and the fraction of optimizer steps whose norm the clip bound (eval.json's `clip`).",
        "",
        "| recipe | seeds | at the first logged step | second half: median | second half: largest | steps clipped |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [f"`{r['recipe']}`", str(r["seeds"]), r["first"], r["late_median"], r["late_max"], r["clipped"]]
        lines.append("| " + " | ".join(cells) + " |")
    return lines

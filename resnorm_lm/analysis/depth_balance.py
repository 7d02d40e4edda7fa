"""How the blocks of a suite's picks share the gradient and the stream across depth: the suite table's fourth part.

Every run logs, per block, the gradient norm of its weight matrices before clipping (``grad_norm/layer_XX``) and
the RMS of the residual stream leaving it (``stream_rms/layer_XX``; resnorm_lm/train/diagnostics.py). The last
block's value over the first's says what the papers argue about: a ratio far above 1 is post-norm's vanishing
gradient near the input (Xiong et al. 2020, Fig. 3; B2T, Takase et al. 2023), below 1 the pre-norm family's larger
gradients near the input; AttnRes claims "more uniform ... gradient distribution across depth" than pre-norm
(arXiv 2603.15031), LayerNorm Scaling and Mix-LN a stream that grows less with depth (arXiv 2502.05795,
2412.13795).

For each recipe: over the pick's fresh seeds, the gradient ratio at the end of training (the mean of the ratios
logged over the last ``TAIL`` of the steps: one logged batch is noisy) and its peak over training, and the stream
RMS ratio at the end; median and range, as the ratios span orders of magnitude (no mean, no t interval). Which
tensor is "the stream" is each design's (``ResidualStream.residual``): for AttnRes the sum of its values, what a
plain stream would hold; for HC and mHC the sum of their streams.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resnorm_lm.analysis.evidence import spread
from resnorm_lm.train.diagnostics import GRAD_NORMS, STREAM_RMS
from resnorm_lm.train.runs import RunDir

if TYPE_CHECKING:
    from resnorm_lm.analysis.suite_report import TunedReport

TAIL = 0.1  # the end of a run: its logged steps in the last 10% of its steps
TINY = 1e-12  # a first block with no gradient at all (ReZero's at init): the ratio stays finite


def ratio_trace(run_dir: Path, prefix: str) -> list[tuple[int, float]]:
    """[(step, last block's value / first block's)] of a per-block metric, from a run's metrics.csv."""
    return [(step, values[-1] / max(values[0], TINY)) for step, values in RunDir(run_dir).per_block(prefix)]


def at_end(trace: list[tuple[int, float]]) -> float:
    """The mean of the ratios logged over the last ``TAIL`` of the run's steps."""
    end = trace[-1][0]
    return statistics.fmean(r for step, r in trace if step >= end * (1 - TAIL))


def balance_rows(report: TunedReport) -> list[dict[str, Any]]:
    """One row per recipe whose pick's fresh seeds that learned log per-block metrics (see the module's docstring)."""
    rows = []
    for recipe in report.suite.recipes:
        learned = report.learned_runs(recipe)
        grads = [t for run in learned if (t := ratio_trace(run, GRAD_NORMS))]
        streams = [t for run in learned if (t := ratio_trace(run, STREAM_RMS))]
        if not grads and not streams:
            continue
        rows.append(
            {
                "recipe": recipe,
                "seeds": max(len(grads), len(streams)),
                "grad_end": spread([at_end(t) for t in grads]),
                "grad_peak": spread([max(r for _, r in t) for t in grads]),
                "stream_end": spread([at_end(t) for t in streams]),
            }
        )
    return rows


def balance_table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown of ``balance_rows``; nothing where no recipe logs per-block metrics."""
    if not rows:
        return []
    lines = [
        "",
        "Across depth (the same seeds): the last block's value over the first's, median (min..max) over the seeds. "
        "Gradient: the norm of each block's weight matrices' gradient before clipping, at the end (the mean over the "
        f"logged steps of the last {TAIL:.0%} of the run) and at its peak over training; above 1, the blocks near the "
        "output get more (post-norm's vanishing gradient near the input); below 1, those near the input do. Stream: "
        "the RMS of the residual stream leaving the block, at the end (AttnRes: the sum of its values; HC, mHC: the "
        "sum of their streams).",
        "",
        "| recipe | seeds | gradient, last / first, at the end | at its peak | stream RMS, last / first, at the end |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| `{r['recipe']}` | {r['seeds']} | {r['grad_end']} | {r['grad_peak']} | {r['stream_end']} |")
    return lines

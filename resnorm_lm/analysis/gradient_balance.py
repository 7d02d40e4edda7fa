"""The balance of the per-block gradient norms over training: the last block's norm over the first's, at every
logged step (``grad_norm/layer_XX`` in metrics.csv, measured before clipping).

A ratio far above 1 means the blocks near the input get almost no gradient (post-norm's vanishing gradient). At
initialization it can be flat and still grow during the warmup (docs/depth.md, under Xavier's init at 24 blocks),
which is why this reads the whole run and not only step 0. Per run: the ratio at the first logged step, its peak
and the step of the peak, how many logged steps it spends above ``--above``, and the ratio at the last step.

    python -m resnorm_lm.analysis.gradient_balance RUN_DIR [RUN_DIR ...] [--above 10]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from resnorm_lm.analysis.plots import GRAD_NORMS, rows_with

TINY = 1e-12  # a first block with no gradient at all: the ratio stays finite


@dataclass(frozen=True)
class GradientBalance:
    """One run's last-over-first gradient-norm ratio over its logged steps."""

    run: Path
    first: float  # at the first logged step
    peak: float
    peak_step: int
    steps_above: int  # logged steps whose ratio exceeds the threshold
    logged_steps: int
    last: float  # at the last logged step

    @classmethod
    def of(cls, run_dir: Path, above: float) -> GradientBalance:
        if not (Path(run_dir) / "metrics.csv").is_file():
            raise ValueError(f"{run_dir}: no metrics.csv there; give run directories (runs/<recipe>/<run>)")
        ratios = []  # (step, last block's norm / first block's)
        for row in rows_with(run_dir, GRAD_NORMS):
            norms = [row[k] for k in sorted((k for k in row if k.startswith(GRAD_NORMS)), key=block_index)]
            ratios.append((int(row["step"]), norms[-1] / max(norms[0], TINY)))
        if not ratios:
            raise ValueError(f"{run_dir}: metrics.csv logs no per-block gradient norms ({GRAD_NORMS}XX)")
        peak_step, peak = max(ratios, key=lambda r: r[1])
        above_count = sum(ratio > above for _, ratio in ratios)
        return cls(run_dir, ratios[0][1], peak, peak_step, above_count, len(ratios), ratios[-1][1])


def block_index(column: str) -> int:
    """``grad_norm/layer_07`` -> 7: blocks in their order at any depth (not the columns' string order)."""
    return int(column.rsplit("_", 1)[1])


def table(balances: list[GradientBalance], above: float) -> str:
    lines = [f"| run | first logged step | peak (step) | logged steps above {above:g} | last step |",
             "|---|---|---|---|---|"]  # fmt: skip
    for b in balances:
        lines.append(f"| {b.run} | {b.first:.1f} | {b.peak:.1f} ({b.peak_step}) | {b.steps_above} of "
                     f"{b.logged_steps} | {b.last:.1f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m resnorm_lm.analysis.gradient_balance",
        description="The last block's gradient norm over the first's at every logged step of each run.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with its metrics.csv)")
    parser.add_argument("--above", type=float, default=10.0, help="count the logged steps whose ratio exceeds this")
    args = parser.parse_args(argv)
    try:
        balances = [GradientBalance.of(run, args.above) for run in args.runs]
    except ValueError as err:
        print(f"gradient_balance: error: {err}", file=sys.stderr)
        return 2
    print(table(balances, args.above))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The last block's value of a per-block metric over the first block's, at every logged step of a run.

Two metrics are logged per block in metrics.csv: the gradient norm of each block's matrices (``grad_norm``,
before clipping) and the RMS of the residual stream leaving each block (``stream_rms``).

- ``grad_norm``: a ratio far above 1 means the blocks near the input get almost no gradient (post-norm's vanishing
  gradient). At initialization it can be flat and still grow during the warmup (docs/depth.md, under Xavier's
  init at 24 blocks), which is why this reads the whole run and not only step 0.
- ``stream_rms``: how much the residual stream grows from the first block to the last (LayerNorm Scaling's
  Fig. 1), at initialization and once trained.

Per run: the ratio at the first logged step, its peak and the step of the peak, how many logged steps it spends
above ``--above``, and the ratio at the last logged step; a markdown table, and a CSV with ``--csv``.

    python -m resnorm_lm.analysis.block_ratio RUN_DIR [RUN_DIR ...] [--metric grad_norm|stream_rms] [--above 10]
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from resnorm_lm.train.diagnostics import GRAD_NORMS, STREAM_RMS
from resnorm_lm.train.runs import RunDir

METRICS = {"grad_norm": GRAD_NORMS, "stream_rms": STREAM_RMS}
TINY = 1e-12  # a first block with nothing (no gradient at all): the ratio stays finite


@dataclass(frozen=True)
class BlockRatio:
    """One run's last-over-first ratio of a per-block metric over its logged steps."""

    run: Path
    first: float  # at the first logged step
    peak: float
    peak_step: int
    steps_above: int  # logged steps whose ratio exceeds the threshold
    logged_steps: int
    last: float  # at the last logged step

    @classmethod
    def of(cls, run_dir: Path, metric: str, above: float) -> BlockRatio:
        prefix = METRICS[metric]
        if not RunDir(run_dir).metrics_path.is_file():
            raise ValueError(f"{run_dir}: no metrics.csv there; give run directories (runs/<recipe>/<run>)")
        ratios = []  # (step, last block's value / first block's)
        for step, values in RunDir(run_dir).per_block(prefix):
            ratios.append((step, values[-1] / max(values[0], TINY)))
        if not ratios:
            raise ValueError(f"{run_dir}: metrics.csv logs no per-block {metric} ({prefix}XX)")
        peak_step, peak = max(ratios, key=lambda r: r[1])
        above_count = sum(ratio > above for _, ratio in ratios)
        return cls(run_dir, ratios[0][1], peak, peak_step, above_count, len(ratios), ratios[-1][1])


def table(ratios: list[BlockRatio], metric: str, above: float) -> str:
    lines = [
        f"{metric}, last block over first:",
        "",
        f"| run | first logged step | peak (step) | logged steps above {above:g} | last logged step |",
        "|---|---|---|---|---|",
    ]
    for r in ratios:
        lines.append(
            f"| {r.run} | {r.first:.2f} | {r.peak:.2f} ({r.peak_step}) | {r.steps_above} of "
            f"{r.logged_steps} | {r.last:.2f} |"
        )
    return "\n".join(lines)


def write_csv(ratios: list[BlockRatio], metric: str, path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["metric", *asdict(ratios[0])])
        writer.writeheader()
        for r in ratios:
            writer.writerow({"metric": metric, **asdict(r)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m resnorm_lm.analysis.block_ratio",
        description="The last block's value of a per-block metric over the first's at every logged step of each run.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with its metrics.csv)")
    parser.add_argument("--metric", choices=sorted(METRICS), default="grad_norm")
    parser.add_argument("--above", type=float, default=10.0, help="count the logged steps whose ratio exceeds this")
    parser.add_argument("--csv", type=Path, help="also write the rows to this CSV file")
    args = parser.parse_args(argv)
    try:
        ratios = [BlockRatio.of(run, args.metric, args.above) for run in args.runs]
    except ValueError as err:
        print(f"block_ratio: error: {err}", file=sys.stderr)
        return 2
    print(table(ratios, args.metric, args.above))
    if args.csv:
        write_csv(ratios, args.metric, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())

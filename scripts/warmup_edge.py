"""Does the placements suite's two-point warmup axis hold a pick back?

The suite's budget (recipes/suites/placements-12l.yaml) tunes two warmups, a quarter or half of the run, and
extends only the LR axis past an edge pick, so every pick sits at an edge of its warmup axis. This probe reruns
each pick's selection run (seed 0) with the warmup one step past that edge (0.25 -> 0.125, 0.5 -> 0.75), its
committed config.yaml otherwise unchanged, in the suite's portable arithmetic, and sets its validation loss beside
the pick's own seed-0 run.

    python scripts/warmup_edge.py train [--jobs 2] [--root runs/warmup-edge]   # resumes; skips finished runs
    python scripts/warmup_edge.py table [--root runs/warmup-edge] [--export docs/results/warmup-edge]

The rule, set before the runs: an edge run better than its pick by more than the suite's LR tolerance (0.05 nats)
means the suite's budget should extend the warmup axis too. One run each, paired with its pick by seed: a smaller
difference is a tie or a small effect this probe does not resolve (the seed pilot's spreads: docs/results.md).
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import sys
from pathlib import Path

from resnorm_lm.analysis.block_measurements import markdown_table
from resnorm_lm.analysis.launchers import train_probe_runs
from resnorm_lm.data.cache import atomic_write
from resnorm_lm.train.arithmetic import PORTABLE_ENV
from resnorm_lm.train.runs import RunDir, copy_small_files

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "docs/results/suites/placements-12l"  # the committed suite: its picks and every run's files
EDGE = {"0.25": "0.125", "0.5": "0.75"}  # a pick's warmup -> one step past it, away from the other grid point
TOLERANCE = 0.05  # nats: the suite's lr_tolerance


def picks() -> list[dict[str, str]]:
    """The suite table's rows that have a pick: recipe, lr, warmup (as the table writes them)."""
    with (SUITE / "table.csv").open(newline="") as f:
        return [row for row in csv.DictReader(f) if row["lr"] and row["warmup"] in EDGE]


def pick_run(row: dict[str, str]) -> Path:
    return SUITE / "run-files" / row["recipe"] / f"cpu-lr{row['lr']}-wf{row['warmup']}-seed0"


def edge_run(row: dict[str, str], root: Path) -> Path:
    return root / row["recipe"] / f"cpu-lr{row['lr']}-wf{EDGE[row['warmup']]}-seed0"


def fit_command(row: dict[str, str], root: Path, resume: bool) -> list[str]:
    """The pick's seed-0 config with the edge warmup, under ``root``."""
    return [
        sys.executable,
        *("-m", "resnorm_lm", "fit", "--config", str(pick_run(row) / "config.yaml")),
        f"--model.optim.warmup_fraction={EDGE[row['warmup']]}",
        f"--run.root={root}",
        f"--run.tag=lr{row['lr']}-wf{EDGE[row['warmup']]}",
        *(["--ckpt_path=last"] if resume else []),
    ]


def train(root: Path, jobs: int) -> int:
    runs = [(edge_run(row, root), functools.partial(fit_command, row, root)) for row in picks()]
    return train_probe_runs(runs, {**os.environ, **PORTABLE_ENV}, jobs, "warmup edge")


def table(root: Path, export: Path | None) -> int:
    rows, better, machines, finished = [], [], set(), []
    for row in picks():
        edge = RunDir(edge_run(row, root))
        if edge.state() != "finished":
            print(f"warmup edge: {edge.path} is not finished; left out", file=sys.stderr)
            continue
        finished.append(edge.path)
        machines.add(edge.manifest()["hardware"]["cpu"])
        pick_loss, summary = RunDir(pick_run(row)).summary()["val_loss"], edge.summary()
        if summary.get("diverged"):  # no loss to set beside the pick's
            edge_loss, gap = f"diverged (step {summary.get('diverged_at_step')})", "-"
        else:
            edge_loss, gap = f"{summary['val_loss']:.3f}", f"{summary['val_loss'] - pick_loss:+.3f}"
            if summary["val_loss"] < pick_loss - TOLERANCE:
                better.append(row["recipe"])
        rows.append(
            {
                "recipe": f"`{row['recipe']}`",
                "lr": row["lr"],
                "pick warmup": row["warmup"],
                "pick val loss": f"{pick_loss:.3f}",
                "edge warmup": EDGE[row["warmup"]],
                "edge val loss": edge_loss,
                "edge - pick": gap,
            }
        )
    verdict = (
        f"Better at the edge by more than {TOLERANCE} nats: {', '.join(better)}."
        if better
        else f"No pick is beaten at the edge by more than {TOLERANCE} nats."
    )
    text = (
        markdown_table(rows) if rows else ""
    ) + f"\n{verdict} One run each (seed 0): {len(rows)} of {len(picks())} picks.\n"
    print(text)
    if export is not None:
        copy_small_files(finished, root, export)
        with atomic_write(export / "warmup-edge.md", "w") as f:
            f.write(
                "# The placements suite's picks, one warmup step past their edge "
                f"(seed 0, {', '.join(sorted(machines))}, portable arithmetic)\n\n"
                "`python scripts/warmup_edge.py train` then `table --export docs/results/warmup-edge`; pick runs: "
                "`docs/results/suites/placements-12l/run-files/`.\n\n" + text
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["train", "table"])
    parser.add_argument("--root", type=Path, default=Path("runs/warmup-edge"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--export", type=Path, help="table: also copy each edge run's small files and the table here")
    args = parser.parse_args(argv)
    return train(args.root, args.jobs) if args.what == "train" else table(args.root, args.export)


if __name__ == "__main__":
    raise SystemExit(main())

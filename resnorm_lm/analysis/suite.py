"""``resnorm-lm suite`` / ``make suite SUITE=<name>``: train a pre-registered suite (``recipes/suites/<name>.yaml``,
read by ``suite_file.py``) and render its tables.

    resnorm-lm suite placements-12l [--jobs 2] [--root runs/suites/placements-12l] [--no-train]

It trains what the suite's design wants and is missing (``suite_designs.py``), one run per core by default (each
run computes on one thread in the portable arithmetic), resumes runs that were interrupted and never trains a
finished run twice; stopped (Ctrl-C, SIGTERM), its runs save at the end of their step and the same command goes on.
Then it evaluates the test split where a table reports it, checks that the runs share one arithmetic
(``provenance.py``; ``--mix-provenance`` renders a mixed table with its rows marked), and writes
``results/suites/<name>/``: ``<name>.md`` (partial ones say so), CSVs and figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from resnorm_lm.analysis.eval_records import unigram_reference
from resnorm_lm.analysis.provenance import ProvenanceError, table_provenance
from resnorm_lm.analysis.suite_designs import SUITE_DESIGNS, SeedPilot, TunedBudget
from resnorm_lm.analysis.suite_file import SuiteError, available_suites, load
from resnorm_lm.analysis.suite_plots import plot_lr_panels, plot_paired_differences, plot_seed_spread
from resnorm_lm.analysis.suite_report import (
    PilotReport,
    TunedReport,
    pilot_markdown,
    tuned_markdown,
    write_tables,
)
from resnorm_lm.analysis.suite_runner import evaluate_test, settle, train_suite
from resnorm_lm.data.cache import atomic_write
from resnorm_lm.train.runs import RunDir


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="resnorm-lm suite", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("suite", help=f"a suite name ({', '.join(available_suites()) or 'none yet'}) or file")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="runs trained at once (default: one per core; each run computes on one thread)",
    )
    parser.add_argument("--root", default=None, help="where the runs live (default: runs/suites/<name>)")
    parser.add_argument("--results", default="results/suites", help="tables and figures go to <results>/<name>/")
    parser.add_argument("--no-train", action="store_true", help="render the tables from the runs that exist")
    parser.add_argument(
        "--export",
        metavar="DIR",
        help="copy each finished run's small files (config, manifest, eval.json, metrics.csv; never "
        "a checkpoint) to DIR/<recipe>/<run>/, for git; the tables render from there with "
        "--root DIR --no-train",
    )
    parser.add_argument(
        "--mix-provenance",
        action="store_true",
        help="render runs of different arithmetic in one table, each row marked (refused otherwise)",
    )
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        suite = load(args.suite)
    except SuiteError as err:
        print(f"resnorm-lm suite: error: {err}", file=sys.stderr)
        return 2
    design = SUITE_DESIGNS.get(suite.design)(suite)
    root = args.root or f"runs/suites/{suite.name}"
    jobs = args.jobs or max(1, os.cpu_count() or 1)
    started = time.time()
    failed = set() if args.no_train else train_suite(suite, design, root, jobs)
    plan, outcomes = settle(design, root, suite.profile)
    if not outcomes:
        print(f"resnorm-lm suite: no finished runs of {suite.name} under {root}", file=sys.stderr)
        return 1
    partial = any(spec not in outcomes for spec in plan) or bool(failed)
    provenance = table_provenance((spec.recipe, spec.run_dir(root, suite.profile)) for spec in outcomes)
    try:
        provenance.check(args.mix_provenance)
    except ProvenanceError as err:
        print(f"resnorm-lm suite: error: {err}", file=sys.stderr)
        return 2
    unigram = unigram_reference(next(iter(outcomes)).run_dir(root, suite.profile))
    out_dir = Path(args.results) / suite.name
    if isinstance(design, TunedBudget):
        report = TunedReport(suite, design, outcomes, root, unigram)
        picks = [
            s.run_dir(root, suite.profile)
            for s in outcomes
            if s.seed in design.seeds and s.setting == report.selections[s.recipe].pick
        ]
        evaluate_test(suite, picks)
        rows = report.rows()
        written = write_tables(
            out_dir,
            suite.name,
            tuned_markdown(report, rows, provenance, partial),
            {"table": rows, "runs": report.grid_rows()},
        )
        written += [
            p for p in (plot_lr_panels(report, rows, out_dir), plot_paired_differences(report, rows, out_dir)) if p
        ]
    else:
        assert isinstance(design, SeedPilot)
        report = PilotReport(suite, design, outcomes, unigram)
        written = write_tables(
            out_dir,
            suite.name,
            pilot_markdown(report, provenance, partial),
            {"spread": report.spread_rows(), "pairing": report.pairing_rows()},
        )
        written.append(plot_seed_spread(report, out_dir))
    print((out_dir / f"{suite.name}.md").read_text())
    if args.export:  # after the test evaluation: its numbers are in eval.json
        copied = export_runs([s.run_dir(root, suite.profile) for s in outcomes], Path(root), Path(args.export))
        print(f"suite {suite.name}: exported the small files of {copied} run(s) to {args.export}")
    state = "PARTIAL: " + f"{len(outcomes)} of the {len(plan)} runs wanted so far" if partial else "complete"
    if failed:
        state += f"; {len(failed)} run(s) failed (see their train.log): run the same command again to retry"
    print(f"suite {suite.name}: {state}; wrote {', '.join(str(p) for p in written)} in {time.time() - started:.0f} s")
    return 0


def export_runs(run_dirs: list[Path], root: Path, dest: Path) -> int:
    """Copy each run's small files (``RunDir.small_files``) to the same place under ``dest``, each written whole;
    the runs whose files changed (or were not there); nothing is removed."""
    copied = 0
    for run_dir in run_dirs:
        changed = False
        for source in RunDir(run_dir).small_files():
            target = dest / source.relative_to(root)
            data = source.read_bytes()
            if not target.is_file() or target.read_bytes() != data:
                with atomic_write(target, "wb") as f:
                    f.write(data)
                changed = True
        copied += changed
    return copied


if __name__ == "__main__":
    sys.exit(main())

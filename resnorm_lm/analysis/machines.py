"""``resnorm-lm machines``: which committed suites this machine can go on with.

A suite's runs share one machine arithmetic, shown by their reference fingerprint, and a suite goes on only on a
machine that computes it (``suite --reuse``; docs/results.md, "Machines"): an AMD EPYC and an Intel Xeon do not
compute the same numbers, even with the portable caps. This reads the run files committed under
``<results>/<suite>/run-files``, probes this machine's reference at each suite's profile in the suite's
arithmetic (``python -m resnorm_lm.train.arithmetic``, in a process of its own) and says, suite by suite, whose
arithmetic its runs are and, where it is this machine's, the command that goes on with it.

    resnorm-lm machines [--results docs/results/suites]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from resnorm_lm.analysis.evidence import segment_arithmetics
from resnorm_lm.analysis.reuse import arithmetic_probe
from resnorm_lm.analysis.suite import Suite, SuiteError, load


def run_arithmetics(run_files: Path) -> Counter[str]:
    """How many of the runs under ``run_files`` (``<recipe>/<run>/manifest.json``) computed in each arithmetic
    (a run resumed on another machine counts in each of its own)."""
    counts: Counter[str] = Counter()
    for manifest in sorted(run_files.glob("*/*/manifest.json")):
        counts.update(segment_arithmetics(manifest.parent))
    return counts


def machine_reference(suite: Suite) -> str:
    """This machine's reference fingerprint at the suite's profile, in the suite's arithmetic, on the CPU."""
    return arithmetic_probe(suite, [])["reference"]


def report(results: Path) -> list[str]:
    """One line a suite with committed run files: its runs' arithmetics, and whether this machine computes them."""
    lines, here_at = [], {}
    for run_files in sorted(p for p in results.glob("*/run-files") if p.is_dir()):
        name = run_files.parent.name
        try:
            suite = load(name)
        except SuiteError:
            lines.append(f"{name}: no suite file of that name (recipes/suites/): not a suite's runs")
            continue
        key = (suite.profile, suite.arithmetic)
        if key not in here_at:
            here_at[key] = machine_reference(suite)
        here, theirs = here_at[key], run_arithmetics(run_files)
        runs = ", ".join(f"{reference} ({n} runs)" for reference, n in theirs.most_common())
        if set(theirs) == {here}:
            go_on = f'make suite SUITE={name} JOBS=2 ARGS="--reuse {run_files}"'
            lines.append(f"{name}: {runs}: this machine's ({here}); go on with: {go_on}")
        elif here in theirs:
            lines.append(
                f"{name}: {runs}: mixed, this machine's ({here}) among others: renders only with --mix-provenance"
            )
        else:
            lines.append(f"{name}: {runs}: not this machine's ({here} at the {suite.profile} profile)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="resnorm-lm machines", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--results", default="docs/results/suites", help="where the suites' run files are committed (<suite>/run-files)"
    )
    args = parser.parse_args(argv)
    lines = report(Path(args.results))
    if not lines:
        print(f"resnorm-lm machines: no <suite>/run-files under {args.results}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0

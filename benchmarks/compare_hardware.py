"""The same runs trained on two machines: final validation loss of each (recipe, setting, seed) on both.

    python benchmarks/compare_hardware.py runs runs-h100            # CPU sweep against the H100 sweep
    python benchmarks/compare_hardware.py runs runs-h100 --profile cpu

    python benchmarks/compare_hardware.py docs/results/suites/placements-12l/run-files \
        docs/results/suites-h100/placements-12l/run-files               # a suite's runs on the EPYC and the H100
    ... --plot docs/results/suites-h100/placements-12l/epyc_vs_h100.png --names EPYC H100   # the pairs drawn

Run directories match by their path under each root (``<recipe>/<profile>-lr..-seed..``). Prints
every pair, then the median and largest absolute difference over the pairs where both runs learn
(validation loss more than ``NOT_LEARNING_NATS`` below the unigram reference, passed as --unigram: the rule by
which ``make compare`` flags a run "not learning").
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resnorm_lm.analysis.sweep import NOT_LEARNING_NATS  # noqa: E402 (after the path)
from resnorm_lm.train.runs import RunDir  # noqa: E402


def val_losses(run_dir: Path) -> dict[str, float | None]:
    """The run's validation loss by where it comes from: ``evaluated`` (a later ``evaluate`` of the whole split,
    as ``make compare`` records it) and ``trained`` (the run's own end-of-training validation, eval.json's
    ``val_loss``: what a suite's table scores). None for a run that diverged."""
    summary = RunDir(run_dir).summary()
    if summary.get("diverged"):
        return {"evaluated": None, "trained": None}
    return {
        "evaluated": ((summary.get("eval") or {}).get("validation") or {}).get("loss"),
        "trained": summary.get("val_loss"),
    }


def labels(first: Path, second: Path) -> tuple[str, str]:
    """Column names for the two roots: the first part of their paths where they differ (suites / suites-h100 for
    docs/results/suites/placements-12l/run-files and docs/results/suites-h100/placements-12l/run-files)."""
    for x, y in zip(first.resolve().parts, second.resolve().parts):
        if x != y:
            return x, y
    return first.name, second.name


def pair(first: Path, second: Path) -> tuple[float | None, float | None]:
    """The two runs' validation losses from the same source: the evaluated one where both have it, else each
    run's own end-of-training one."""
    a, b = val_losses(first), val_losses(second)
    source = "evaluated" if a["evaluated"] is not None and b["evaluated"] is not None else "trained"
    return a[source], b[source]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--unigram", type=float, default=6.401, help="the unigram reference (compare prints it)")
    parser.add_argument("--plot", type=Path, default=None, help="also draw every pair into this PNG")
    parser.add_argument("--names", nargs=2, default=None, help="the two machines' names (default: from the paths)")
    args = parser.parse_args()
    first, second = Path(args.first), Path(args.second)
    learning, pairs = [], []
    names = tuple(args.names) if args.names else labels(first, second)
    print(f"{'run':48} {names[0]:>12} {names[1]:>12} {'diff':>8}")
    for path in sorted(first.glob(f"*/{args.profile}-*/eval.json")):
        rel = path.parent.relative_to(first)
        if not RunDir(second / rel).summary_path.is_file():
            continue
        a, b = pair(first / rel, second / rel)
        diff = None if a is None or b is None else b - a
        if a is not None or b is not None:
            pairs.append({"recipe": rel.parts[0], "first": a, "second": b})
        print(
            f"{str(rel):48} {'-' if a is None else f'{a:.3f}':>12} {'-' if b is None else f'{b:.3f}':>12} "
            f"{'-' if diff is None else f'{diff:+.3f}':>8}"
        )
        if diff is not None and max(a, b) < args.unigram - NOT_LEARNING_NATS:
            learning.append(abs(diff))
    if not learning:
        print("no pair where both runs learn", file=sys.stderr)
        return 1
    print(
        f"\n{len(learning)} pairs where both learn: |diff| median {statistics.median(learning):.4f}, "
        f"largest {max(learning):.4f} nats"
    )
    if args.plot is not None:
        from resnorm_lm.analysis.plots import plot_machine_pairs

        print(f"wrote {plot_machine_pairs(pairs, names, args.unigram, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

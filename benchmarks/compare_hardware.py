"""The same runs trained on two machines: final validation loss of each (recipe, setting, seed) on both.

    python benchmarks/compare_hardware.py runs runs-h100            # CPU sweep against the H100 sweep
    python benchmarks/compare_hardware.py runs runs-h100 --profile cpu

Run directories match by their path under each root (``<recipe>/<profile>-lr..-wu..-seed..``). Prints
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


def val_loss(run_dir: Path) -> float | None:
    summary = RunDir(run_dir).summary()
    ev = summary.get("eval") or {}
    return None if summary.get("diverged") else (ev.get("validation") or {}).get("loss")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--unigram", type=float, default=6.401, help="the unigram reference (compare prints it)")
    args = parser.parse_args()
    first, second = Path(args.first), Path(args.second)
    learning = []
    print(f"{'run':48} {first.name:>10} {second.name:>10} {'diff':>8}")
    for path in sorted(first.glob(f"*/{args.profile}-*/eval.json")):
        rel = path.parent.relative_to(first)
        if not RunDir(second / rel).summary_path.is_file():
            continue
        a, b = val_loss(first / rel), val_loss(second / rel)
        diff = None if a is None or b is None else b - a
        print(
            f"{str(rel):48} {'-' if a is None else f'{a:.3f}':>10} {'-' if b is None else f'{b:.3f}':>10} "
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
    return 0


if __name__ == "__main__":
    sys.exit(main())

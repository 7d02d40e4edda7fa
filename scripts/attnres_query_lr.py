"""Do AttnRes's depth queries cause its late gap to pre-norm at high LRs?

With its queries at zero, AttnRes is pre-norm but for the norms' eps (each norm reads the mean of the values where
pre-norm's reads their sum), so what separates the two is what the queries learn. In the suite ``designs-12l``
(EPYC, seed 0) AttnRes is level with pre-norm at the middle evaluation at every LR, and behind at the end at 4e-3
and 8e-3 (docs/designs.md, "AttnRes so far"). AdamW moves the queries from zero at the full LR, undecayed. This
probe trains, at the same protocol as the suites (recipes/suites/designs-12l.yaml, the portable arithmetic, a
quarter of the run as warmup, seed 0), three arms at each LR: pre-norm, AttnRes, and AttnRes with its queries at
a tenth of the LR (``--model.optim.lr_multipliers={"*.query": 0.1}``, the same schedule), and the control: AttnRes
with its queries frozen at zero (factor 0), which is pre-norm but for the eps and should end where pre-norm does.
If what the queries learn is the cause, the frozen arm has no late gap and the slowed one a smaller gap. One seed
an arm: a first look, in this machine's arithmetic, paired only with its own pre-norm.

    python scripts/attnres_query_lr.py train [--lrs 0.008 0.004] [--jobs 1] [--root runs/attnres-query-lr]
    python scripts/attnres_query_lr.py table [--root runs/attnres-query-lr] [--export docs/results/attnres-query-lr]
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
from resnorm_lm.analysis.suite import load
from resnorm_lm.data.cache import atomic_write
from resnorm_lm.train.arithmetic import PORTABLE_ENV
from resnorm_lm.train.runs import RunDir, copy_small_files

SUITE = "designs-12l"  # whose protocol (its `train:` section) every arm trains with
WARMUP, SEED = "0.25", 0
ARMS = {  # arm: (recipe, the factor of the LR its depth queries train at; None: no option, the LR itself)
    "pre-norm": ("prenorm-12l", None),
    "AttnRes": ("attnres-12l", None),
    "AttnRes, queries at 0.1 x LR": ("attnres-12l", 0.1),
    "AttnRes, queries frozen at zero": ("attnres-12l", 0.0),
}
MIDDLE_STEP = 249  # the suites' middle evaluation (val_check_interval 250)


def arm_root(root: Path, arm: str) -> Path:
    """The arm's own root: ``fit`` puts its run at <root>/<recipe>/cpu-lr<lr>-wf<warmup>-seed<seed>."""
    factor = ARMS[arm][1]
    return root / "plain" if factor is None else root / f"query{factor:g}"


def arm_run(root: Path, arm: str, lr: str) -> Path:
    return arm_root(root, arm) / ARMS[arm][0] / f"cpu-lr{lr}-wf{WARMUP}-seed{SEED}"


def fit_command(arm: str, lr: str, root: Path, resume: bool) -> list[str]:
    recipe, factor = ARMS[arm]
    extra = [] if factor is None else [f'--model.optim.lr_multipliers={{"*.query": {factor}}}']
    return [
        sys.executable,
        *("-m", "resnorm_lm", "fit", "--recipe", recipe, "--profile", "cpu", "--tuned", "none"),
        f"--seed_everything={SEED}",
        f"--run.root={arm_root(root, arm)}",
        f"--run.tag=lr{lr}-wf{WARMUP}",
        f"--model.optim.lr={lr}",
        f"--model.optim.warmup_fraction={WARMUP}",
        *load(SUITE).train_args(),
        *extra,
        "--trainer.enable_progress_bar=false",
        *(["--ckpt_path=last"] if resume else []),
    ]


def train(root: Path, lrs: list[str], jobs: int) -> int:
    runs = [(arm_run(root, arm, lr), functools.partial(fit_command, arm, lr, root)) for lr in lrs for arm in ARMS]
    return train_probe_runs(runs, {**os.environ, **PORTABLE_ENV}, jobs, "attnres query lr")


def val_at(run: Path, step: int) -> float | None:
    """The validation loss logged at ``step``."""
    with (run / "metrics.csv").open(newline="") as f:
        found = [float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss") and int(r["step"]) == step]
    return found[-1] if found else None


def table(root: Path, lrs: list[str], export: Path | None) -> int:
    rows, trained = [], []
    for lr in lrs:
        runs = {arm: arm_run(root, arm, lr) for arm in ARMS}
        unfinished = [arm for arm, run in runs.items() if RunDir(run).state() != "finished"]
        if unfinished:
            print(f"lr {lr}: not finished, left out (train first): {', '.join(unfinished)}", file=sys.stderr)
        if "pre-norm" in unfinished:
            continue
        runs = {arm: run for arm, run in runs.items() if arm not in unfinished}
        trained += runs.values()
        reference = {"middle": val_at(runs["pre-norm"], MIDDLE_STEP), "end": RunDir(runs["pre-norm"]).summary()}
        for arm, run in runs.items():
            middle, end = val_at(run, MIDDLE_STEP), RunDir(run).summary()["val_loss"]
            rows.append(
                {
                    "lr": lr,
                    "arm": arm,
                    f"val loss, step {MIDDLE_STEP}": f"{middle:.3f}",
                    "val loss, end": f"{end:.3f}",
                    f"Δ pre-norm, step {MIDDLE_STEP}": f"{middle - reference['middle']:+.3f}",
                    "Δ pre-norm, end": f"{end - reference['end']['val_loss']:+.3f}",
                    f"gain from step {MIDDLE_STEP} to the end": f"{middle - end:.3f}",
                }
            )
    if not rows:
        return 1
    machines = sorted({RunDir(run).manifest()["hardware"]["cpu"] for run in trained})
    text = (
        f"Seed {SEED}, a quarter of the run as warmup, the protocol of suite `{SUITE}`, the portable arithmetic "
        f"({', '.join(machines)}). One seed an arm: no interval; Δ is against this table's own pre-norm run.\n\n"
        + markdown_table(rows)
        + "\n"
    )
    print(text)
    if export is not None:
        copy_small_files(trained, root, export)
        with atomic_write(export / "attnres-query-lr.md", "w") as f:
            f.write(
                "# AttnRes with its depth queries slowed and frozen: a first look\n\n"
                "`python scripts/attnres_query_lr.py train` then `table --export docs/results/attnres-query-lr` "
                "(the script's docstring says why).\n\n" + text
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["train", "table"])
    parser.add_argument("--root", type=Path, default=Path("runs/attnres-query-lr"))
    parser.add_argument("--lrs", nargs="+", default=["0.008"], help="peak LRs, written as the suites write them")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--export", type=Path, help="table: also copy each run's small files and the table here")
    args = parser.parse_args(argv)
    if args.what == "train":
        return train(args.root.resolve(), args.lrs, args.jobs)
    return table(args.root.resolve(), args.lrs, args.export)


if __name__ == "__main__":
    raise SystemExit(main())

"""Where does DyT, set up as its paper says, learn in every seed?

In the suite ``designs-12l-dyt`` (recipes/suites/designs-12l-dyt.yaml) DyT's paper setup (``prenorm-12l-dyt-paper``)
picked 4e-3 with half the run warming up at the selection seed (5.394), and then stayed at the unigram loss in three
of its five fresh seeds there. This probe asks whether a lower LR of the suite's own grid trains in every seed, and
how far behind LayerNorm DyT ends where it does: fresh seeds at the next two settings down at a quarter of the run's
warmup, 2e-3 (the suite's runner-up: the suite trains its seeds 1 and 2, the probe 3 to 5) and 1e-3 (seeds 1 to 5).
Each run is the setting's committed seed-0 config with the seed changed, as the suite's seed-N runs are, in the
suite's portable arithmetic.

    python scripts/dyt_seeds.py train [--jobs 2] [--root runs/dyt-seeds]   # resumes; skips finished runs
    python scripts/dyt_seeds.py table [--root runs/dyt-seeds] [--export docs/results/dyt-seeds]

The table sets each setting's fresh seeds (the suite's and the probe's) beside pre-norm's at its pick, paired by
seed: the suite's rule (failures counted apart, the loss over the seeds that learned) and, since a failed run's loss
is a measurement too, every seed at its own loss. Chosen after the suite's fresh seeds were seen: a probe beside
the suite's table, not a row of it.
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import sys
from pathlib import Path

from resnorm_lm.analysis.block_measurements import markdown_table
from resnorm_lm.analysis.evidence import Proportion, interval_text, mean_interval, paired_difference
from resnorm_lm.analysis.launchers import train_probe_runs
from resnorm_lm.analysis.sweep import NOT_LEARNING_NATS, unigram_reference
from resnorm_lm.data.cache import atomic_write
from resnorm_lm.train.arithmetic import PORTABLE_ENV
from resnorm_lm.train.runs import RunDir, copy_small_files

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "docs/results/suites/designs-12l-dyt/run-files"  # the committed suite's runs
RECIPE, REFERENCE = "prenorm-12l-dyt-paper", "prenorm-12l"
REFERENCE_PICK = ("0.004", "0.25")  # pre-norm's pick in the suite
SEEDS = [1, 2, 3, 4, 5]  # the suite's fresh seeds
PROBE = {("0.002", "0.25"): [3, 4, 5], ("0.001", "0.25"): [1, 2, 3, 4, 5]}  # (lr, warmup): the seeds trained here
SHOWN = [("0.004", "0.5"), *PROBE]  # the suite's pick first
EARLY_STEP = 99  # the readout's input is read here: where the learning seeds' token-specific part has escaped


def run_name(lr: str, warmup: str, seed: int) -> str:
    return f"cpu-lr{lr}-wf{warmup}-seed{seed}"


def suite_run(lr: str, warmup: str, seed: int, recipe: str = RECIPE) -> Path:
    return SUITE / recipe / run_name(lr, warmup, seed)


def probe_run(lr: str, warmup: str, seed: int, root: Path) -> Path:
    return root / RECIPE / run_name(lr, warmup, seed)


def fit_command(lr: str, warmup: str, seed: int, root: Path, resume: bool) -> list[str]:
    """The setting's seed-0 config with another seed (and its data order), under ``root``."""
    return [
        sys.executable,
        *("-m", "resnorm_lm", "fit", "--config", str(suite_run(lr, warmup, 0) / "config.yaml")),
        f"--seed_everything={seed}",
        f"--data.seed={seed}",
        f"--run.root={root}",
        f"--run.tag=lr{lr}-wf{warmup}",
        "--trainer.enable_progress_bar=false",
        *(["--ckpt_path=last"] if resume else []),
    ]


def train(root: Path, jobs: int) -> int:
    runs = [
        (probe_run(lr, wf, seed, root), functools.partial(fit_command, lr, wf, seed, root))
        for (lr, wf), seeds in PROBE.items()
        for seed in seeds
    ]
    return train_probe_runs(runs, {**os.environ, **PORTABLE_ENV}, jobs, "dyt seeds")


def readout_at(run: Path, step: int) -> tuple[float, float] | None:
    """The readout input's shared mean and token-specific rest (RMS each) last logged at or before ``step``."""
    with (run / "metrics.csv").open(newline="") as f:
        logged = [r for r in csv.DictReader(f) if r.get("readout/mean_rms") and int(r["step"]) <= step]
    return (float(logged[-1]["readout/mean_rms"]), float(logged[-1]["readout/rest_rms"])) if logged else None


def seed_runs(lr: str, warmup: str, root: Path) -> dict[int, Path]:
    """The setting's finished fresh-seed runs, the suite's or the probe's, by seed."""
    found = {}
    for seed in SEEDS:
        for run in (suite_run(lr, warmup, seed), probe_run(lr, warmup, seed, root)):
            if RunDir(run).state() == "finished":
                found[seed] = run
                break
    return found


def table(root: Path, export: Path | None) -> int:
    reference = {s: RunDir(suite_run(*REFERENCE_PICK, s, REFERENCE)).summary()["val_loss"] for s in SEEDS}
    unigram = unigram_reference(suite_run(*REFERENCE_PICK, 1, REFERENCE))
    rows, seed_rows, trained = [], [], []
    for lr, warmup in SHOWN:
        runs = seed_runs(lr, warmup, root)
        trained += [run for run in runs.values() if run.is_relative_to(root)]
        summaries = {seed: RunDir(run).summary() for seed, run in runs.items()}
        # a diverged run has no loss to pair: a failure in the count, absent from both differences
        losses = {s: e["val_loss"] for s, e in summaries.items() if not e.get("diverged") and e.get("val_loss")}
        learned = {seed: loss for seed, loss in losses.items() if loss <= unigram - NOT_LEARNING_NATS}
        selection = RunDir(suite_run(lr, warmup, 0)).summary()["val_loss"]
        rows.append(
            {
                "lr": lr,
                "warmup": warmup,
                "seed 0 (selection)": f"{selection:.3f}",
                "fresh seeds": len(runs),
                "failed": Proportion(len(runs) - len(learned), len(runs)).text(),
                "val loss (learned)": interval_text(mean_interval(list(learned.values()))),
                "Δ val (learned)": interval_text(paired_difference(learned, reference), sign=True),
                "Δ val (every seed)": interval_text(paired_difference(losses, reference), sign=True),
            }
        )
        for seed, run in sorted(runs.items()):
            early = readout_at(run, EARLY_STEP)
            seed_rows.append(
                {
                    "lr": lr,
                    "warmup": warmup,
                    "seed": seed,
                    "trained by": "suite" if run.is_relative_to(SUITE) else "probe",
                    "val loss": f"{losses[seed]:.3f}"
                    if seed in losses
                    else f"diverged (step {summaries[seed].get('diverged_at_step')})",
                    "learned": "yes" if seed in learned else "no",
                    f"readout mean / rest at step {EARLY_STEP}": f"{early[0]:.1f} / {early[1]:.2f}" if early else "-",
                    "pre-norm, same seed": f"{reference[seed]:.3f}",
                }
            )
    text = (
        f"Pre-norm (LayerNorm) at its pick, {REFERENCE_PICK[0]} / {REFERENCE_PICK[1]}: "
        f"{interval_text(mean_interval(list(reference.values())))} over seeds {SEEDS[0]}-{SEEDS[-1]}. "
        f"Not learning: within {NOT_LEARNING_NATS} nats of the unigram loss {unigram:.3f}. "
        "Δ: paired by seed against pre-norm, mean ± 95% "
        "t interval.\n\n" + markdown_table(rows) + "\n\nEach seed (the readout's input: the RMS of the part every "
        "token shares, and of the rest):\n\n" + markdown_table(seed_rows) + "\n"
    )
    print(text)
    if export is not None:
        copy_small_files(trained, root, export)
        machines = sorted({RunDir(run).manifest()["hardware"]["cpu"] for run in trained})
        with atomic_write(export / "dyt-seeds.md", "w") as f:
            f.write(
                f"# DyT's paper setup: fresh seeds below the suite's pick ({', '.join(machines)}, portable "
                "arithmetic)\n\n`python scripts/dyt_seeds.py train` then `table --export docs/results/dyt-seeds`; "
                "the suite's runs: `docs/results/suites/designs-12l-dyt/run-files/`. Chosen after the suite's fresh "
                "seeds at its pick were seen (scripts/dyt_seeds.py says why).\n\n" + text
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["train", "table"])
    parser.add_argument("--root", type=Path, default=Path("runs/dyt-seeds"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--export", type=Path, help="table: also copy each probe run's small files and the table here")
    args = parser.parse_args(argv)
    return train(args.root, args.jobs) if args.what == "train" else table(args.root.resolve(), args.export)


if __name__ == "__main__":
    raise SystemExit(main())

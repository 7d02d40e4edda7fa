"""When do pre-norm's attention logits grow, and does QK-norm hold them from the start?

``scripts/qk_attention_logits.py`` measures the logits ``q.k / sqrt(head_dim)`` at the final weights only: pre-norm's
largest is 27.5 at its pick and 1.55e3 at 1.6e-2 with a quarter of the run warming up, QK-norm's stays near 26 at
every LR. Wortsman et al. (2023, arXiv 2309.14322) describe the growth as training goes: logits that grow until the
softmax is one-hot, then a loss that stops falling. Every run now logs each attention's largest logit every
``log_every_n_steps`` (``attn_logit_max/layer_XX``, resnorm_lm/train/diagnostics.py), so this probe trains again,
from their committed configs, a few of the suites' runs, each exactly as the suite trained it (its config, the
portable arithmetic: the same losses to the last digit on a machine of the suite's arithmetic, which the table
checks; the logging reads the queries and keys and changes nothing), and reads the logits over training::

    python scripts/attention_logit_growth.py train [--root runs/logit-growth] [--jobs 1]
    python scripts/attention_logit_growth.py table [--root runs/logit-growth] [--export docs/results/logit-growth]

The runs: pre-norm at its pick and at the setting where its attention collapses, QK-norm over all heads at that
setting, and QK-norm per head at its pick at a seed that ends among the best and at the one that lags. One run per
(setting, seed): a mechanism seen beside the suites' tables, not a row of them.
"""

from __future__ import annotations

import argparse
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from resnorm_lm.analysis.block_measurements import markdown_table
from resnorm_lm.analysis.launchers import refit_command, train_probe_runs
from resnorm_lm.data.cache import atomic_write, write_csv_atomic
from resnorm_lm.train.arithmetic import PORTABLE_ENV
from resnorm_lm.train.diagnostics import ATTN_LOGIT_MAX
from resnorm_lm.train.runs import RunDir, copy_small_files

REPO = Path(__file__).resolve().parents[1]
SUITES = REPO / "docs/results/suites"
AT_FRACTIONS = (0.0, 0.1, 0.2, 0.5, 1.0)  # of the run: the table reads the last logged step at or before each


@dataclass(frozen=True)
class Probe:
    recipe: str
    suite: str  # the committed suite whose run is trained again
    lr: str
    warmup: str
    seed: int

    @property
    def name(self) -> str:
        return f"cpu-lr{self.lr}-wf{self.warmup}-seed{self.seed}"

    @property
    def committed(self) -> Path:
        return SUITES / self.suite / "run-files" / self.recipe / self.name

    def run(self, root: Path) -> Path:
        return root / self.recipe / self.name


PROBES = [
    Probe("prenorm-12l", "placements-12l", "0.004", "0.25", 0),  # its pick at the selection seed
    Probe("prenorm-12l", "placements-12l", "0.016", "0.25", 0),  # where its attention collapses
    Probe("prenorm-12l-qknorm", "designs-12l", "0.016", "0.25", 0),  # QK-norm over all heads there
    Probe("prenorm-12l-qknorm-head", "designs-12l", "0.016", "0.5", 1),  # per head at its pick: a seed among the best
    Probe("prenorm-12l-qknorm-head", "designs-12l", "0.016", "0.5", 2),  # ... and the seed that lags
]


def fit_command(probe: Probe, root: Path, resume: bool) -> list[str]:
    """The committed run's own config, written under ``root``."""
    return refit_command(probe.committed / "config.yaml", root, f"lr{probe.lr}-wf{probe.warmup}", resume)


def train(root: Path, jobs: int) -> int:
    runs = [(probe.run(root), functools.partial(fit_command, probe, root)) for probe in PROBES]
    return train_probe_runs(runs, {**os.environ, **PORTABLE_ENV}, jobs, "attention logit growth")


def largest_over_blocks(run: Path) -> list[tuple[int, float, int]]:
    """``(step measured at, largest logit, its block)`` at every logged step of ``run`` (``RunDir.per_block``
    gives runs from before ``diagnostics/step`` was logged the step measured too)."""
    return [(step, max(v), v.index(max(v))) for step, v in RunDir(run).per_block(ATTN_LOGIT_MAX)]


def at_step(trace: list[tuple[int, float, int]], step: float) -> tuple[int, float, int]:
    """The last logged row at or before ``step`` (the first row where none is)."""
    before = [row for row in trace if row[0] <= step]
    return before[-1] if before else trace[0]


def table(root: Path, export: Path | None) -> int:
    rows, traces, finished = [], [], []
    for probe in PROBES:
        run = probe.run(root)
        files = RunDir(run)
        if files.state() != "finished":
            print(f"attention logit growth: {probe.recipe} {probe.name}: not trained yet")
            continue
        trace = largest_over_blocks(run)
        if not trace:
            print(f"attention logit growth: {run}: no attn_logit_max columns (trained before they were logged)")
            continue
        steps = int(files.summary()["step"])
        loss, committed = files.summary().get("val_loss"), RunDir(probe.committed).summary().get("val_loss")
        peak = max(trace, key=lambda row: row[1])
        rows.append(
            {
                "recipe": f"`{probe.recipe}`",
                "lr": probe.lr,
                "warmup": probe.warmup,
                "seed": probe.seed,
                "val loss": f"{loss:.3f}",
                "the committed run's, to the last digit": "yes" if committed == loss else "no",
                **{
                    f"largest at {fraction:.0%}": "{1:.3g} (step {0})".format(*at_step(trace, fraction * steps))
                    for fraction in AT_FRACTIONS
                },
                "largest over training (step, block)": f"{peak[1]:.3g} ({peak[0]}, {peak[2]})",
            }
        )
        traces += [
            {"recipe": probe.recipe, "lr": probe.lr, "warmup": probe.warmup, "seed": probe.seed}
            | {"step": step, "block": block, "largest_logit": value}
            for step, value, block in trace
        ]
        finished.append((probe, run))
    text = (
        "Each run's largest attention logit |q.k|/sqrt(head_dim) over its 12 blocks, its heads and the step's "
        "training tokens, as logged every 10 steps (`attn_logit_max/layer_XX`), read at the last logged step at or "
        "before each fraction of the run, and its largest over training.\n\n" + markdown_table(rows) + "\n"
    )
    print(text)
    if export is not None and rows:
        from resnorm_lm.analysis.plots import plot_attention_logits

        copy_small_files([run for _, run in finished], root, export / "run-files")
        write_csv_atomic(export / "traces.csv", traces)
        export.mkdir(parents=True, exist_ok=True)
        labelled = {f"{p.recipe} {p.lr}/{p.warmup} seed {p.seed}": [run] for p, run in finished}
        plot_attention_logits(labelled, export)
        machines = sorted({RunDir(run).manifest()["hardware"]["cpu"] for _, run in finished})
        with atomic_write(export / "logit-growth.md", "w") as f:
            f.write(
                f"# Attention logits over training ({', '.join(machines)}, portable arithmetic)\n\n"
                "`python scripts/attention_logit_growth.py train`, then `table --export docs/results/logit-growth` "
                "(scripts/attention_logit_growth.py says why); every logged step: [traces.csv](traces.csv); the "
                "figure: [attention_logits.png](attention_logits.png); the runs trained again: `run-files/`.\n\n" + text
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["train", "table"])
    parser.add_argument("--root", type=Path, default=Path("runs/logit-growth"))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--export", type=Path, help="table: also write the table, traces.csv, the figure and run files")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    return train(root, args.jobs) if args.what == "train" else table(root, args.export)


if __name__ == "__main__":
    raise SystemExit(main())

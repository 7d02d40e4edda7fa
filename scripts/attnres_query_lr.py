"""Do AttnRes's depth queries cause its late gap to pre-norm at high LRs?

With its queries at zero, AttnRes is pre-norm but for the norms' eps (each norm reads the mean of the values where
pre-norm's reads their sum), so what separates the two is what the queries learn. In the suite ``designs-12l``
(EPYC, seed 0) AttnRes is level with pre-norm at the middle evaluation at every LR, and behind at the end at 4e-3
and 8e-3 (docs/designs.md, "AttnRes so far"). AdamW moves the queries from zero at the full LR, undecayed. This
probe trains, at the same protocol as the suites (recipes/suites/designs-12l.yaml, the portable arithmetic, a
quarter of the run as warmup, seed 0 unless told), five arms at each LR: pre-norm, AttnRes, AttnRes with its
queries at a tenth of the LR (``--model.optim.lr_multipliers={"*.query": 0.1}``, the same schedule), the
control: AttnRes with its queries frozen at zero (factor 0), which computes pre-norm's function but for the eps and
the order of additions, from the same weights on the same batches; and AttnRes with only its readout's query frozen
at zero (the readout reads the uniform average, pre-norm's stream; every sublayer's query learns). The control
measures how far apart two runs of one function end at one seed (a rounding-level difference grows at a high LR): a
difference between arms smaller than that is not a result at one seed. Each seed's arms pair with that seed's
pre-norm; with several seeds, the table adds the paired mean and its interval. In this machine's arithmetic only.

    python scripts/attnres_query_lr.py train [--lrs 0.008 0.004] [--seeds 0 1 2] [--jobs 1] [--root ROOT]
    python scripts/attnres_query_lr.py table [--lrs ...] [--seeds ...] [--root ROOT] [--export DIR]
    python scripts/attnres_query_lr.py depth [--lrs ...] [--seeds ...] [--root ROOT] [--export DIR]

(ROOT: runs/attnres-query-lr; the committed table: --export docs/results/attnres-query-lr.) ``depth`` sets the
arms' balance across depth side by side, the AttnRes paper's claim of "more uniform output magnitudes and gradient
distribution across depth" (arXiv 2603.15031): what each block adds to the stream (first and last block,
``resnorm-lm layer-contribution``), each block's gradient norm at the end of training (``block-ratio``), and where
the readout's input comes from (``depth-weights``). It needs the runs' checkpoints (the training machine's).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import sys
from pathlib import Path
from typing import NamedTuple

from resnorm_lm.analysis.block_measurements import (
    DEFAULT_TOKENS,
    contribution_summary,
    markdown_table,
    run_contribution,
)
from resnorm_lm.analysis.depth_balance import at_end, ratio_trace
from resnorm_lm.analysis.depth_weights import readers_of
from resnorm_lm.analysis.evidence import interval_text, paired_difference
from resnorm_lm.analysis.launchers import train_probe_runs
from resnorm_lm.analysis.suite import load
from resnorm_lm.data.cache import atomic_write, write_csv_atomic
from resnorm_lm.train.arithmetic import PORTABLE_ENV
from resnorm_lm.train.diagnostics import GRAD_NORMS
from resnorm_lm.train.runs import RunDir, copy_small_files

SUITE = "designs-12l"  # whose protocol (its `train:` section) every arm trains with
WARMUP = "0.25"


class Arm(NamedTuple):
    """One arm of the probe: a recipe trained with its own LR multipliers, under its own folder."""

    recipe: str
    root: str  # its runs' folder under ROOT (fit puts a run at <root>/<recipe>/cpu-lr<lr>-wf<warmup>-seed<seed>)
    lr_multipliers: dict[str, float] | None  # model.optim.lr_multipliers; None: no option, every parameter at the LR


ARMS = {
    "pre-norm": Arm("prenorm-12l", "plain", None),
    "AttnRes": Arm("attnres-12l", "plain", None),
    "AttnRes, queries at 0.1 x LR": Arm("attnres-12l", "query0.1", {"*.query": 0.1}),
    "AttnRes, queries frozen at zero": Arm("attnres-12l", "query0", {"*.query": 0.0}),
    # the readout's query alone frozen at zero (the readout reads the uniform average, as pre-norm's stream),
    # the sublayers' queries learn: does the readout's routing starve the late blocks (docs/designs.md)?
    "AttnRes, readout query frozen at zero": Arm("attnres-12l", "readout-query0", {"*readout.query": 0.0}),
}
MIDDLE_STEP = 249  # the suites' middle evaluation (val_check_interval 250)


def arm_root(root: Path, arm: str) -> Path:
    return root / ARMS[arm].root


def arm_run(root: Path, arm: str, lr: str, seed: int = 0) -> Path:
    return arm_root(root, arm) / ARMS[arm].recipe / f"cpu-lr{lr}-wf{WARMUP}-seed{seed}"


def fit_command(arm: str, lr: str, seed: int, root: Path, resume: bool) -> list[str]:
    recipe, _, multipliers = ARMS[arm]
    extra = [] if multipliers is None else [f"--model.optim.lr_multipliers={json.dumps(multipliers)}"]
    return [
        sys.executable,
        *("-m", "resnorm_lm", "fit", "--recipe", recipe, "--profile", "cpu", "--tuned", "none"),
        f"--seed_everything={seed}",  # the data order too (data.seed follows it), as the suites' seed-k runs
        f"--run.root={arm_root(root, arm)}",
        f"--run.tag=lr{lr}-wf{WARMUP}",
        f"--model.optim.lr={lr}",
        f"--model.optim.warmup_fraction={WARMUP}",
        *load(SUITE).train_args(),
        *extra,
        "--trainer.enable_progress_bar=false",
        *(["--ckpt_path=last"] if resume else []),
    ]


def train(root: Path, lrs: list[str], seeds: list[int], jobs: int) -> int:
    runs = [
        (arm_run(root, arm, lr, seed), functools.partial(fit_command, arm, lr, seed, root))
        for seed in seeds
        for lr in lrs
        for arm in ARMS
    ]
    return train_probe_runs(runs, {**os.environ, **PORTABLE_ENV}, jobs, "attnres query lr")


def val_at(run: Path, step: int) -> float | None:
    """The validation loss logged at ``step``."""
    with (run / "metrics.csv").open(newline="") as f:
        found = [float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss") and int(r["step"]) == step]
    return found[-1] if found else None


def losses(run: Path) -> dict[str, float]:
    """The run's validation loss at the middle evaluation and at the end."""
    return {"middle": val_at(run, MIDDLE_STEP), "end": RunDir(run).summary()["val_loss"]}


def arguments(lrs: list[str], seeds: list[int]) -> str:
    """The ``--lrs``/``--seeds`` that made a committed table, for its header."""
    return f"--lrs {' '.join(lrs)} --seeds {' '.join(map(str, seeds))}"


def table(root: Path, lrs: list[str], seeds: list[int], export: Path | None) -> int:
    rows, trained = [], []
    ends: dict[tuple[str, str], dict[int, float]] = {}  # (lr, arm): {seed: validation loss at the end}
    for lr in lrs:
        for seed in seeds:
            runs = {arm: arm_run(root, arm, lr, seed) for arm in ARMS}
            unfinished = [arm for arm, run in runs.items() if RunDir(run).state() != "finished"]
            if unfinished:
                print(
                    f"lr {lr}, seed {seed}: not finished, left out (train first): {', '.join(unfinished)}",
                    file=sys.stderr,
                )
            if "pre-norm" in unfinished:
                continue
            runs = {arm: run for arm, run in runs.items() if arm not in unfinished}
            trained += runs.values()
            reference = losses(runs["pre-norm"])
            for arm, run in runs.items():
                loss = losses(run)
                ends.setdefault((lr, arm), {})[seed] = loss["end"]
                rows.append(
                    {
                        "lr": lr,
                        "seed": seed,
                        "arm": arm,
                        f"val loss, step {MIDDLE_STEP}": f"{loss['middle']:.3f}",
                        "val loss, end": f"{loss['end']:.3f}",
                        f"Δ pre-norm, step {MIDDLE_STEP}": f"{loss['middle'] - reference['middle']:+.3f}",
                        "Δ pre-norm, end": f"{loss['end'] - reference['end']:+.3f}",
                        f"gain from step {MIDDLE_STEP} to the end": f"{loss['middle'] - loss['end']:.3f}",
                    }
                )
    if not rows:
        return 1
    machines = sorted({RunDir(run).manifest()["hardware"]["cpu"] for run in trained})
    text = (
        "A quarter of the run as warmup, the protocol of suite "
        f"`{SUITE}`, the portable arithmetic ({', '.join(machines)}). Δ is against the same seed's pre-norm run "
        "of this table.\n\n" + markdown_table(rows) + "\n"
    )
    paired = [
        {
            "lr": lr,
            "arm": arm,
            "seeds": len(by_seed),
            "Δ pre-norm at the end, paired by seed": interval_text(
                paired_difference(by_seed, ends[(lr, "pre-norm")]), sign=True
            ),
        }
        for (lr, arm), by_seed in ends.items()
        if arm != "pre-norm" and len(by_seed) >= 2
    ]
    if paired:
        text += "\nPaired by seed (mean ± 95% t interval over the seeds):\n\n" + markdown_table(paired) + "\n"
    print(text)
    if export is not None:
        copy_small_files(trained, root, export)
        with atomic_write(export / "attnres-query-lr.md", "w") as f:
            f.write(
                "# AttnRes with its depth queries slowed and frozen: a first look\n\n"
                f"`python scripts/attnres_query_lr.py train {arguments(lrs, seeds)}` then `table "
                f"{arguments(lrs, seeds)} --export docs/results/attnres-query-lr` (the script's docstring says "
                "why).\n\n" + text
            )
    return 0


def readout_share_of_late_blocks(run: Path) -> float:
    """The share of the readout's input magnitude that comes from the second half of the blocks' sublayers
    (``depth-weights``' magnitude shares summed over them): the queries at zero read the uniform average, pre-norm's
    stream, so the frozen arm gives pre-norm's share and the learned arms say where their readout moved."""
    readers, _ = readers_of(run, DEFAULT_TOKENS)
    readout = next(r for r in readers if r.name == "readout")
    blocks = (len(readout.sources) - 1) // 2
    late = {f"block {b} {s}" for b in range(blocks // 2, blocks) for s in ("attention", "MLP")}
    return sum(share for source, share in zip(readout.sources, readout.shares) if source in late)


def depth(root: Path, lrs: list[str], seeds: list[int], export: Path | None) -> int:
    """The finished arms' balance across depth at their final weights (the module's docstring)."""
    rows = []
    for lr in lrs:
        for seed in seeds:
            for arm, (recipe, _, _) in ARMS.items():
                run = arm_run(root, arm, lr, seed)
                files = RunDir(run)
                if files.state() != "finished" or not files.has_checkpoint():
                    print(f"lr {lr}, seed {seed}, {arm}: not finished or no last.ckpt here, left out", file=sys.stderr)
                    continue
                update = contribution_summary(run, run_contribution(run, DEFAULT_TOKENS))
                grad = at_end(ratio_trace(run, GRAD_NORMS))
                late = readout_share_of_late_blocks(run) if recipe == "attnres-12l" else None
                rows.append(
                    {
                        "lr": lr,
                        "seed": seed,
                        "arm": arm,
                        "update RMS, first block": f"{update['update_first']:.3g}",
                        "last block": f"{update['update_last']:.3g}",
                        "last / first": f"{update['update_last_over_first']:.2f}",
                        "largest / smallest": f"{update['update_max_over_min']:.2f}",
                        "gradient, last / first, at the end": f"{grad:.3f}",
                        "readout's input from the second half of the blocks": "-" if late is None else f"{late:.2f}",
                    }
                )
    if not rows:
        return 1
    text = (
        f"At each run's final weights, on the first {DEFAULT_TOKENS:,} validation targets. Update RMS: what a block "
        "adds to the stream (its two sublayers' outputs), `resnorm-lm layer-contribution`. Gradient: the norm of the "
        "last block's weight matrices' gradient over the first's, the mean over the logged steps of the last 10% of "
        "the run (`grad_norm/layer_XX` in metrics.csv). Readout's input: the share of the readout's input magnitude "
        "(weight times the value's RMS, `resnorm-lm depth-weights`) from the sublayers of the second half of the "
        "blocks (6-11 of 12); a readout whose query is frozen at zero reads the uniform average, pre-norm's stream.\n\n"
        + markdown_table(rows)
        + "\n"
    )
    print(text)
    if export is not None:
        write_csv_atomic(export / "depth.csv", rows)
        with atomic_write(export / "depth.md", "w") as f:
            f.write(
                "# AttnRes's probe arms across depth\n\n"
                f"`python scripts/attnres_query_lr.py depth {arguments(lrs, seeds)} --export "
                "docs/results/attnres-query-lr` (the script's docstring says why), on the machine that trained the "
                "runs (their checkpoints).\n\n" + text
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["train", "table", "depth"])
    parser.add_argument("--root", type=Path, default=Path("runs/attnres-query-lr"))
    parser.add_argument("--lrs", nargs="+", default=["0.008"], help="peak LRs, written as the suites write them")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="each arm at each of these seeds")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--export", type=Path, help="table: also copy each run's small files and the table here")
    args = parser.parse_args(argv)
    if args.what == "train":
        return train(args.root.resolve(), args.lrs, args.seeds, args.jobs)
    if args.what == "depth":
        return depth(args.root.resolve(), args.lrs, args.seeds, args.export)
    return table(args.root.resolve(), args.lrs, args.seeds, args.export)


if __name__ == "__main__":
    raise SystemExit(main())

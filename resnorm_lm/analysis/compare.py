"""``resnorm-lm compare`` / ``make compare``: a fair comparison of recipes, each at its own tuned setting.

    resnorm-lm compare --recipes prenorm-12l postnorm-12l --profile cpu \
        --lrs 5e-4 1e-3 2e-3 --warmups 0.1 0.4 --seeds 1 2 3 [--jobs 2]

1. The grid: every recipe at every (peak lr, warmup fraction) with the first seed (``--grid-seeds``).
2. Each recipe's setting is the one with the lowest mean validation loss over the seeds run at it
   (``resnorm_lm.analysis.sweep.select``); the chosen setting, and the runner-up when it lies within the seed
   spread, are then trained with every seed of ``--seeds`` and the choice is made again.
3. The test split is evaluated and reported only at each recipe's chosen setting.

Runs are evaluated at the precision each trained with (``--eval-precision 32-true`` for fp32); the tables
say which precision their numbers were measured at.

Every (recipe, lr, warmup, seed) is its own run directory, runs/<recipe>/<profile>-lr<lr>-wf<w>-seed<k>
(without --lrs/--warmups: the recipe's own setting, runs/<recipe>/<profile>-seed<k>), trained when
missing, resumed when unfinished, reused when finished, so an interrupted sweep continues where it
stopped. Writes results/<profile>/compare.md and .csv (one row per recipe), grid.csv (one row per
recipe and setting), lr_sensitivity.png, loss_curves.png and grad_norms.png (at the chosen settings).
Runs whose validation loss stays within 0.1 nats of the unigram reference are flagged "not learning",
apart from "diverged".

With ``--launcher slurm`` each run is a SLURM job (``slurm_launcher.py``; its options from the site's config file
and ``--slurm-*``): compare submits them, shows their progress, waits and writes the
same tables. Started again after an interruption, it submits only the runs that are neither finished nor queued
or running. docs/cluster.md walks through it.

With ``--depths 6 12 24 48`` each (recipe, depth) is its own comparison as above (its own grid, or
``--lrs-at DEPTH=LR,...``; its own pick, seeds and edge flag), trained with ``--model.arch.n_layer=N`` in
runs/<recipe>/<profile>-d<N>-lr<lr>-wu<w>-seed<k>; the recipe's own depth keeps the directories of a sweep
without depths. It adds depth.md/.csv, depth_loss.png, stability_map.png, depth_lr.png,
depth_grad_norms.png and the layer contribution at the picks (layer_contribution.md/.csv/.png,
``resnorm_lm.analysis.block_measurements``). docs/depth.md describes them.

## The report

The comparison as a reader sees it: compare.md (the table at the picks, then the grid), compare.csv and
grid.csv, and the figures at the chosen settings (loss curves, gradient norms, stream RMS, LR sensitivity,
clipping). The rows come from ``tables.py``; this module formats and writes them.

With a depth axis, the depth's own: depth.md/.csv, its figures, the layer contribution at the picks.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from resnorm_lm.analysis.block_measurements import DEFAULT_TOKENS, block_means, run_contribution
from resnorm_lm.analysis.evidence import ProvenanceError, group_rows, num, table_provenance
from resnorm_lm.analysis.launchers import SweepTrainer
from resnorm_lm.analysis.slurm_launcher import CONFIG_ENV, SlurmError, SlurmOptions, SlurmSweepTrainer
from resnorm_lm.analysis.sweep import (
    NOT_LEARNING_NATS,
    Arm,
    RunSpec,
    Selection,
    chosen_runs,
    depth_sort_key,
    ensure_picks_tested,
    grid_rows,
    recipe_row,
    run_sweep,
    sort_key,
    unigram_reference,
    write_tuned_overlays,
)
from resnorm_lm.analysis.trained_run import PRECISIONS, RUN
from resnorm_lm.data.cache import atomic_write, write_csv_atomic
from resnorm_lm.train.loaded_run import CheckpointError
from resnorm_lm.train.precision import PrecisionError
from resnorm_lm.train.recipes import RecipeError, recipe_depth, recipe_path, resolve_profile
from resnorm_lm.train.runs import RunDir

TWELVE_LAYER_PLACEMENTS = [
    "prenorm-12l",
    "postnorm-12l",
    "sandwich-12l",
    "deepnorm-12l",
    "rezero-12l",
    "mixln-12l",
    "lns-12l",
    "b2t-12l",
    "resi_dual-12l",
    "noresidual-12l",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="resnorm-lm compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipes", nargs="+", default=TWELVE_LAYER_PLACEMENTS)
    parser.add_argument("--profile", default="auto")
    parser.add_argument(
        "--lrs", nargs="*", type=float, default=None, help="peak learning rates (default: the recipe's)"
    )
    parser.add_argument(
        "--warmups",
        nargs="*",
        type=float,
        default=None,
        help="warmups as fractions of the run, model.optim.warmup_fraction (default: the recipe's)",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1], help="seeds at each chosen setting")
    parser.add_argument(
        "--grid-seeds",
        nargs="+",
        type=int,
        default=None,
        help="seeds across the whole grid (default: the first of --seeds)",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs trained at once (one GPU each where there are enough)"
    )
    parser.add_argument(
        "--launcher",
        choices=["local", "slurm"],
        default="local",
        help="local: fit subprocesses on this machine, --jobs at a time; slurm: each run a SLURM job (docs/cluster.md)",
    )
    add_slurm_args(parser)
    parser.add_argument("--root", default="runs", help="where the runs live")
    parser.add_argument("--results", default="results", help="where tables and plots go: <results>/<profile>/")
    parser.add_argument("--no-train", action="store_true", help="only evaluate and tabulate runs that exist")
    parser.add_argument("--train-args", default="", help="extra LightningCLI overrides for the training runs")
    parser.add_argument(
        "--depths",
        nargs="+",
        type=int,
        default=None,
        help="numbers of blocks (--model.arch.n_layer): each recipe at each depth is its own "
        "tuned comparison; a recipe's own depth keeps its run directories",
    )
    parser.add_argument(
        "--lrs-at",
        nargs="+",
        default=[],
        metavar="DEPTH=LR,LR,...",
        help="the LR grid at one depth in place of --lrs, e.g. 48=2.5e-4,5e-4,1e-3 (with --depths)",
    )
    parser.add_argument(
        "--contribution-tokens",
        type=int,
        default=DEFAULT_TOKENS,
        help="validation tokens on which the layer contribution is measured at the picks (with "
        f"--depths; default {DEFAULT_TOKENS}; 0: not measured)",
    )
    parser.add_argument(
        "--mix-provenance",
        action="store_true",
        help="render runs of different arithmetic (fingerprints: docs/comparing.md) in one table, "
        "each row marked with its provenance (refused otherwise)",
    )
    parser.add_argument(
        "--eval-precision",
        default=RUN,
        choices=PRECISIONS,
        metavar="PRECISION",
        help="run (default): evaluate each run at the precision it trained with; 32-true: fp32; "
        "auto: this machine's fastest; or any Lightning precision",
    )
    args = parser.parse_args(argv)
    args.lrs = args.lrs or None
    args.warmups = args.warmups or None
    args.grid_seeds = args.grid_seeds or args.seeds[:1]
    for lr in args.lrs or []:
        if not lr > 0:
            parser.error(f"--lrs: every learning rate must be > 0, got {lr:g}")
    for warmup in args.warmups or []:
        if not 0 <= warmup < 1:
            steps = (
                (
                    " (warmups are fractions of the run since the schedule stopped depending on its length: 200 "
                    "steps of the cpu profile's 500 is 0.4)"
                )
                if warmup >= 1
                else ""
            )
            parser.error(f"--warmups: every warmup must be a fraction of the run in [0, 1), got {warmup:g}{steps}")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    check_depth_args(parser, args)
    check_slurm_args(parser, args)
    return args


SLURM_ARGS = {
    "partition": "slurm_partition",
    "account": "slurm_account",
    "time": "slurm_time",
    "gpus_per_run": "slurm_gpus",
    "cpus_per_run": "slurm_cpus",
    "max_jobs": "slurm_max_jobs",
}


def add_slurm_args(parser: argparse.ArgumentParser) -> None:
    slurm = parser.add_argument_group("with --launcher slurm (defaults from the site's config file; docs/cluster.md)")
    slurm.add_argument(
        "--slurm-config",
        metavar="YAML",
        help=f"the site's defaults (default: ${CONFIG_ENV}, else ~/.config/resnorm-lm/slurm.yaml where it exists)",
    )
    slurm.add_argument("--slurm-partition", metavar="NAME", help="the partition each job asks for")
    slurm.add_argument("--slurm-account", metavar="NAME", help="the account each job is billed to")
    slurm.add_argument("--slurm-time", metavar="TIME", help="each job's time limit, e.g. 04:00:00")
    slurm.add_argument(
        "--slurm-gpus",
        type=int,
        metavar="G",
        help="GPUs per run, one task each (default: 1 where the profile trains on a GPU, else 0)",
    )
    slurm.add_argument("--slurm-cpus", type=int, metavar="C", help="CPUs per run")
    slurm.add_argument(
        "--slurm-max-jobs",
        type=int,
        metavar="N",
        help=f"the most of the sweep's jobs queued or running at once (default {SlurmOptions.max_jobs})",
    )


def check_slurm_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--launcher and the --slurm-* options: checked, and with --launcher slurm read into ``args.slurm``
    (``SlurmOptions``: the site's config file, then the options given)."""
    given = {name: getattr(args, dest) for name, dest in SLURM_ARGS.items()}
    args.slurm = None
    if args.launcher != "slurm":
        named = [
            f"--{dest.replace('_', '-')}"
            for dest in [*SLURM_ARGS.values(), "slurm_config"]
            if getattr(args, dest) is not None
        ]
        if named:
            parser.error(f"{', '.join(named)}: only with --launcher slurm")
        return
    if args.jobs > 1:
        parser.error("--jobs is the local launcher's; with --launcher slurm, --slurm-max-jobs is the most at once")
    try:
        args.slurm = SlurmOptions.load(args.slurm_config, **given)
    except ValueError as err:
        parser.error(str(err))


def check_depth_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--depths, --lrs-at and --contribution-tokens: checked, and --lrs-at parsed into {depth: [lr, ...]}."""
    for depth in args.depths or []:
        if depth < 1:
            parser.error(f"--depths: every depth must be a number of blocks >= 1, got {depth}")
    args.depths = sorted(set(args.depths)) if args.depths else None
    if args.depths and "model.arch.n_layer" in args.train_args:
        parser.error("--train-args sets model.arch.n_layer, which --depths sets for each run: give depths by --depths")
    if args.contribution_tokens < 0:
        parser.error(f"--contribution-tokens must be >= 0, got {args.contribution_tokens}")
    lrs_at: dict[int, list[float]] = {}
    for item in args.lrs_at:
        depth, _, lrs = item.partition("=")
        try:
            lrs_at[int(depth)] = [float(x) for x in lrs.split(",")]
        except ValueError:
            parser.error(f"--lrs-at: {item!r} is not DEPTH=LR,LR,... (for example 48=2.5e-4,5e-4,1e-3)")
        if not args.depths or int(depth) not in args.depths:
            parser.error(
                f"--lrs-at: {depth} is not one of --depths ({' '.join(map(str, args.depths or [])) or 'none given'})"
            )
        if not all(lr > 0 for lr in lrs_at[int(depth)]):
            parser.error(f"--lrs-at: every learning rate must be > 0, got {item!r}")
    args.lrs_at = lrs_at


def command_line(args, profile: str) -> str:
    parts = [f'make compare RECIPES="{" ".join(args.recipes)}" PROFILE={profile}']
    if args.lrs:
        parts.append(f'LRS="{" ".join(f"{x:g}" for x in args.lrs)}"')
    if args.warmups:
        parts.append(f'WARMUPS="{" ".join(f"{x:g}" for x in args.warmups)}"')
    if args.depths:
        parts.append(f'DEPTHS="{" ".join(map(str, args.depths))}"')
    if args.lrs_at:
        at = (f"{depth}={','.join(f'{x:g}' for x in lrs)}" for depth, lrs in sorted(args.lrs_at.items()))
        parts.append(f'LRS_AT="{" ".join(at)}"')
    parts.append(f'SEEDS="{" ".join(map(str, args.seeds))}"')
    extra = []  # what else the runs need to be reproduced: where they live, how they were trained
    if args.root != "runs":
        extra.append(f"--root {args.root}")
    if args.train_args:
        extra.append(f'--train-args="{args.train_args}"')
    if args.depths and args.contribution_tokens != DEFAULT_TOKENS:
        extra.append(f"--contribution-tokens {args.contribution_tokens}")
    if getattr(args, "mix_provenance", False):
        extra.append("--mix-provenance")
    if getattr(args, "eval_precision", RUN) != RUN:
        extra.append(f"--eval-precision {args.eval_precision}")
    if extra:
        parts.append(f"ARGS='{' '.join(extra)}'")
    return " ".join(parts)


def sweep_trainer(args: argparse.Namespace, profile: str) -> SweepTrainer:
    """What trains the sweep's runs: fit subprocesses here (``SweepTrainer``), or SLURM jobs."""
    group = sweep_group(args.root, profile)
    if args.launcher == "slurm":
        return SlurmSweepTrainer(profile, args.root, args.train_args.split(), args.slurm, group=group)
    return SweepTrainer(profile, args.root, args.train_args.split(), args.jobs, group=group)


def sweep_group(root: str, profile: str) -> str:
    """The W&B group of a sweep's runs, 'compare-<root's name>-<profile>' (no spaces: a SLURM job's options
    are split into words)."""
    name = Path(root).resolve().name or "root"
    return "-".join(["compare", *name.split(), profile])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        profile = resolve_profile(args.profile)
        for recipe in args.recipes:
            recipe_path(recipe)
    except RecipeError as err:
        print(f"resnorm-lm compare: error: {err}", file=sys.stderr)
        return 2
    started = time.time()
    try:
        trainer = sweep_trainer(args, profile)
        selections, runs = run_sweep(args, profile, trainer)
    # a checkpoint corrupt, foreign, unsafe or on changed data; SLURM out of reach, or refusing the sweep
    except (CheckpointError, PrecisionError, SlurmError) as err:
        print(f"resnorm-lm compare: error: {err}", file=sys.stderr)
        return 2
    if not runs:
        print("resnorm-lm compare: no finished runs to compare", file=sys.stderr)
        return 1
    provenance = table_provenance((spec.recipe, run_dir) for spec, run_dir in runs.items())
    try:
        provenance.check(args.mix_provenance)
    except ProvenanceError as err:
        print(f"resnorm-lm compare: error: {err}", file=sys.stderr)
        return 2
    unigram = unigram_reference(next(iter(runs.values())))
    try:
        ensure_picks_tested(selections.values(), runs, args.eval_precision)
    except (CheckpointError, PrecisionError) as err:
        print(f"resnorm-lm compare: error: {err}", file=sys.stderr)
        return 2
    rank = depth_sort_key if args.depths else sort_key
    table = sorted(
        (recipe_row(sel, runs, unigram, len(args.seeds), args.eval_precision) for sel in selections.values()), key=rank
    )
    if len(provenance.labels) > 1:  # a mixed table, asked for: each row says where its runs come from
        for row in table:
            row["provenance"] = provenance.row_mark(row["recipe"])
    grid = grid_rows(selections, unigram, runs)
    out_dir = Path(args.results) / profile
    command, hardware = command_line(args, profile), hardware_of(list(runs.values()))
    report = markdown_report(table, grid, profile, command, unigram, hardware, bool(args.depths), provenance.lines())
    write_report(out_dir, report, table, grid)
    own_depths = {r: recipe_depth(r, profile) for r in args.recipes}
    write_tuned_overlays(table, grid, out_dir / "tuned", profile, command, hardware, own_depths)
    plot_comparison(selections, runs, grid, unigram, out_dir, bool(args.depths), bool(args.lrs or args.lrs_at))
    if args.depths:
        written = write_depth_results(
            selections, runs, table, grid, unigram, out_dir, command, args.contribution_tokens
        )
        print(f"compare: the depth axis: wrote {', '.join(written)}")
    print("\n" + report)
    print(
        f"compare: wrote {out_dir}/compare.md, compare.csv, grid.csv, plots and tuned/<recipe>.yaml (copy one "
        f"into recipes/tuned/{profile}/ to make it the default) in {time.time() - started:.0f} s"
    )
    return 0


def markdown_report(
    table: list[dict],
    grid: list[dict],
    profile: str,
    command: str,
    unigram: float | None,
    hardware: str,
    depths: bool = False,
    provenance: list[str] | None = None,
) -> str:
    """compare.md; with ``depths`` a "layers" column after the recipe says which depth each row is; ``provenance``:
    the arithmetic the runs computed with (``evidence.py``), a line each."""
    runs = sum(r["n_runs"] for r in table)
    hours = sum(r["train_s"] for r in table) / 3600
    lines = [
        f"# Comparison: profile `{profile}`",
        "",
        f"Command: `{command}`",
        "",
        f"Date: {time.strftime('%Y-%m-%d')}. Hardware: {hardware}. Cost: {runs} runs, {hours:.2f} h of training.",
        "",
        *(f"Provenance: {line}" for line in provenance or []),
        *([""] if provenance else []),
        "Each recipe at its own setting: the (peak lr, warmup) with the lowest mean validation loss over the "
        "seeds run at it; test is evaluated only at that setting. Mean ± standard deviation over seeds. "
        f"Unigram reference (validation cross-entropy of the train split's token frequencies): "
        f"{num(unigram, None)} nats; within {NOT_LEARNING_NATS} nats of it (or above) is 'not learning'.",
        "",
        "Eval precision: the precision the numbers were measured at (by default each run's training "
        "precision; `--eval-precision` to choose).",
        "",
        "| recipe | lr | warmup | seeds | val loss | val ppl | val bpb | test ppl | test bpb | eval precision "
        "| status |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if depths:
        lines[-2:] = [with_layers(line, "layers") for line in lines[-2:]]
    for r in table:
        lr = "-" if r.get("lr") is None else f"{r['lr']:g}"
        lr += f" ({r['lr_edge']} of grid)" if r.get("lr_edge") else ""
        warmup = "-" if r.get("warmup") is None else str(r["warmup"])
        warmup += f" ({r['warmup_edge']} of grid)" if r.get("warmup_edge") else ""
        name = r["recipe"] + (f" [{r['provenance']}]" if r.get("provenance") else "")
        cells = [name, lr, warmup, str(r.get("n_seeds", 0))]
        for key, digits in (("val_loss", 3), ("val_ppl", 1), ("val_bpb", 3), ("test_ppl", 1), ("test_bpb", 3)):
            cells.append(num(r.get(f"{key}_mean"), r.get(f"{key}_std"), digits))
        line = "| " + " | ".join([*cells, r.get("eval_precision") or "-", r["status"]]) + " |"
        lines.append(with_layers(line, r.get("n_layer")) if depths else line)
    inits = {r["recipe"]: r["init"] for r in table if r.get("init")}
    if len(set(inits.values())) == 1:
        lines += ["", f"Init: `{next(iter(inits.values()))}` in every run (`model.arch.init`)."]
    elif inits:
        lines += ["", "Init (`model.arch.init`): " + "; ".join(f"{r} `{i}`" for r, i in inits.items()) + "."]
    if any(r.get("lr_edge") or r.get("warmup_edge") for r in table):
        lines += [
            "",
            "A chosen lr (or warmup) at the edge of the grid means the grid should be widened on that "
            "side (an lr's grid: the lrs run at the chosen warmup; a warmup's: those run at the chosen lr).",
        ]
    lines += [
        "",
        "## The grid (validation loss, mean over the seeds run at each setting that did not diverge)",
        "",
        "Clipped: the mean fraction of optimizer steps whose global gradient norm exceeded the clip "
        "(`-`: not recorded, or no clipping by norm).",
        "",
    ]
    header = [
        "| recipe | lr | warmup | seeds | val loss | clipped | status | chosen |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [with_layers(line, "layers") for line in header] if depths else header
    for g in grid:
        lr = "recipe" if g["lr"] is None else f"{g['lr']:g}"
        warmup = "recipe" if g["warmup"] is None else str(g["warmup"])
        loss = num(g["val_loss_mean"], g["val_loss_std"])
        chosen = "yes" if g["chosen"] else ""
        clipped = "-" if g.get("clipped_mean") is None else f"{g['clipped_mean']:.0%}"
        line = f"| {g['recipe']} | {lr} | {warmup} | {g['n_seeds']} | {loss} | {clipped} | {g['status']} | {chosen} |"
        lines.append(with_layers(line, g.get("n_layer")) if depths else line)
    return "\n".join(lines) + "\n"


def with_layers(line: str, layers: Any) -> str:
    """A markdown table line with a cell inserted after the first (the recipe): its depth."""
    cells = line.split("|")  # ['', ' recipe ', ...]
    cell = "---" if set(cells[1]) == {"-"} else f" {'-' if layers is None else layers} "
    return "|".join([*cells[:2], cell, *cells[2:]])


def hardware_of(run_dirs: list[Path]) -> str:
    """The machines the runs were trained on, from their manifests (older manifests say less: used only alone)."""
    found: dict[str, bool] = {}  # description -> recorded by a newer manifest (CPU model and bf16 known)
    for run_dir in run_dirs:
        manifest = RunDir(run_dir).manifest()
        if not manifest:
            continue
        hw = manifest.get("hardware", {})
        if hw.get("gpus"):
            found[", ".join(hw["gpus"])] = True
            continue
        bf16 = {True: ", native bf16", False: ", no native bf16"}.get(hw.get("cpu_native_bf16"), "")
        found[f"{hw.get('cpu', 'CPU')} ({hw.get('cpu_count')} cores{bf16}, no GPU)"] = bool(bf16)
    described = sorted(d for d, full in found.items() if full) or sorted(found)
    return "; ".join(described) or "unknown"


def arm_label(sel: Selection, depths: bool) -> str:
    """How figures name a (recipe, depth): the recipe, and its depth on a depth axis."""
    return f"{sel.recipe}, {sel.n_layer} blocks" if depths else sel.recipe


def write_report(out_dir: Path, report: str, table: list[dict], grid: list[dict]) -> None:
    """compare.md (``report``, from ``markdown_report``), compare.csv (``table``) and grid.csv (``grid``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_write(out_dir / "compare.md", "w") as f:
        f.write(report)
    write_csv_atomic(out_dir / "compare.csv", table)
    write_csv_atomic(out_dir / "grid.csv", grid)


def plot_comparison(
    selections: dict[Any, Selection],
    runs: dict[RunSpec, Path],
    grid: list[dict],
    unigram: float | None,
    out_dir: Path,
    depths: bool,
    lr_grid: bool,
) -> None:
    """The figures of every comparison: LR sensitivity and clipping over the grid (``lr_grid``: an LR axis was
    swept), and at the chosen settings loss curves, gradient norms, stream RMS and attention logits (a line per
    recipe, and per depth with ``depths``)."""
    from resnorm_lm.analysis.plots import (
        plot_attention_logits,
        plot_clipping,
        plot_grad_norms,
        plot_loss_curves,
        plot_lr_sensitivity,
        plot_stream_rms,
    )

    at_chosen = {arm_label(sel, depths): [d for _, d in chosen_runs(sel, runs)] for sel in selections.values()}
    at_chosen = {label: dirs for label, dirs in at_chosen.items() if dirs}
    if lr_grid:  # with depths, a line per (recipe, depth)
        labels = {(sel.recipe, sel.n_layer): arm_label(sel, depths) for sel in selections.values()}
        labelled = [{**g, "recipe": labels[g["recipe"], g["n_layer"]]} for g in grid]
        plot_lr_sensitivity(labelled, unigram, out_dir)
        if any(g["clipped_mean"] is not None for g in grid):
            plot_clipping(labelled, out_dir)
    else:
        print("compare: no LRS grid: lr_sensitivity.png not drawn")
    if at_chosen:
        plot_loss_curves(at_chosen, out_dir)
        plot_grad_norms(at_chosen, out_dir)
        plot_stream_rms(at_chosen, out_dir)
        plot_attention_logits(at_chosen, out_dir)


# ---------------------------------------------------------------------------------------------------------------------
# The depth axis of a comparison (``compare --depths``): depth.md/.csv (each recipe's validation loss at its pick,
# depth by depth, and the sizes), the depth figures (loss and chosen LR against depth, stability maps, gradient
# norms and stream RMS per depth) and the layer contribution at the picks (layer_contribution.md/.csv/.png,
# measured by ``resnorm_lm.analysis.block_measurements``). docs/depth.md describes them.


def depth_rows(table: list[dict]) -> list[dict]:
    """depth.csv: each (recipe, depth) at its pick, with its size and the tokens it saw per parameter."""
    keys = [
        "recipe",
        "n_layer",
        "params",
        "tokens",
        "lr",
        "warmup",
        "lr_edge",
        "warmup_edge",
        "n_seeds",
        "val_loss_mean",
        "val_loss_std",
        "test_loss_mean",
        "test_loss_std",
        "status",
    ]
    rows = []
    for r in sorted(table, key=lambda r: (r["recipe"], r.get("n_layer") or 0)):
        row = {k: r.get(k) for k in keys}
        row["tokens_per_param"] = r["tokens"] / r["params"] if r.get("tokens") and r.get("params") else None
        rows.append(row)
    return rows


def depth_markdown(rows: list[dict], unigram: float | None, command: str) -> str:
    """depth.md: validation loss at each pick, a recipe per line and a depth per column, and the sizes."""
    depths = sorted({r["n_layer"] for r in rows if r.get("n_layer")})
    lines = [
        "# Depth: each recipe tuned at each depth",
        "",
        f"Command: `{command}`",
        "",
        "Validation loss at each (recipe, depth)'s own chosen LR (mean ± std over the seeds at the pick), "
        "and the LR. Every depth trains on the same tokens, so a deeper model has more parameters per "
        f"token. Unigram reference: {num(unigram, None)} nats.",
        "",
        "| recipe | " + " | ".join(f"depth {d}" for d in depths) + " |",
        "|---" * (len(depths) + 1) + "|",
    ]
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        cells = []
        for depth in depths:
            r = next((r for r in rows if r["recipe"] == recipe and r.get("n_layer") == depth), None)
            if r is None:
                cells.append("")
                continue
            if r.get("val_loss_mean") is None:
                cells.append(r["status"])
                continue
            notes = [f"{r['lr_edge']} of grid"] if r.get("lr_edge") else []
            notes += [f"warmup {r['warmup']}: {r['warmup_edge']} of grid"] if r.get("warmup_edge") else []
            notes += [] if r["status"] == "ok" else [r["status"]]
            note = f" ({'; '.join(notes)})" if notes else ""
            cells.append(f"{num(r['val_loss_mean'], r.get('val_loss_std'))} @ {r['lr']:g}{note}")
        lines.append(f"| {recipe} | " + " | ".join(cells) + " |")
    sizes = []
    for depth in depths:
        at = [r for r in rows if r.get("n_layer") == depth and r.get("params")]
        if at:
            params = sorted({r["params"] for r in at})
            span = f"{params[0]:,}" + (f"-{params[-1]:,}" if len(params) > 1 else "")
            sizes.append(
                f"{depth} blocks: {span} parameters, {at[0]['tokens']:,} tokens "
                f"({at[0]['tokens'] / params[-1]:.2f} tokens per parameter)"
            )
    if sizes:
        lines += ["", "Sizes (parameters counted once, embeddings included; tokens seen in training):", ""]
        lines += [f"- {line}" for line in sizes]
    return "\n".join(lines) + "\n"


def contribution_rows(
    picked: dict[tuple[str, int], list[tuple[RunSpec, Path]]], n_tokens: int
) -> tuple[list[dict], list[str]]:
    """layer_contribution.csv: a row per (recipe, depth, seed, block), measured on the runs at the picks;
    and the runs that could not be measured (no checkpoint and no cached measurement)."""

    rows, missing = [], []
    for (recipe, n_layer), pairs in sorted(picked.items()):
        for spec, run_dir in pairs:
            record = run_contribution(run_dir, n_tokens)
            if record is None:
                missing.append(str(run_dir))
                continue
            per_block = zip(record["skipped_loss"], record["loss_increase"], record["angular_distance"])
            for layer, (skipped, increase, angle) in enumerate(per_block):
                rows.append(
                    {
                        "recipe": recipe,
                        "n_layer": n_layer,
                        "seed": spec.seed,
                        "layer": layer,
                        "tokens": record["tokens"],
                        "loss": record["loss"],
                        "loss_skipped": skipped,
                        "loss_increase": increase,
                        "angular_distance": angle,
                        "update_rms": record["update_rms"][layer] if "update_rms" in record else None,
                    }
                )
    return rows, missing


NEAR_IDENTITY_NATS = 0.01  # a block whose removal costs less than this does next to nothing


def contribution_markdown(rows: list[dict]) -> str:
    """layer_contribution.md: per (recipe, depth), means over seeds of the per-block numbers, summarised by
    the first and last quarter of the blocks (every block's numbers are in the CSV)."""
    tokens = sorted({r["tokens"] for r in rows})
    lines = [
        "# Layer contribution at the chosen runs",
        "",
        "Per block l: the validation loss increase when block l is skipped (its output replaced by its input; "
        "LNS arXiv 2502.05795 and Mix-LN arXiv 2412.13795 measure the drop when one layer is removed), and "
        "the angular distance between its input and output, (1/pi) arccos(cos_sim(x_l, x_{l+1})) averaged "
        "over tokens (Gromov et al. 2024, arXiv 2403.17887). ResiDual: skipping passes both streams on; the "
        "distance is on its post-norm stream. Measured on the first "
        f"{', '.join(f'{t:,}' for t in tokens)} validation tokens, at the final weights of each seed at the "
        "pick; means over the seeds. First / last quarter: the mean over the first / last ceil(L/4) blocks.",
        "",
        "| recipe | blocks | seeds | loss | Δloss first quarter | Δloss last quarter | largest Δloss (block) | "
        "angle first quarter | angle last quarter | blocks under 0.01 nats |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (recipe, n_layer), mine in sorted(group_rows(rows, ("recipe", "n_layer")).items()):
        seeds = sorted({r["seed"] for r in mine})
        layers, increase = block_means(mine, "loss_increase")
        _, angle = block_means(mine, "angular_distance")
        q = math.ceil(len(layers) / 4)
        worst = max(range(len(layers)), key=lambda i: increase[i])
        loss = statistics.fmean(r["loss"] for r in mine if r["layer"] == 0)
        near_identity = sum(v < NEAR_IDENTITY_NATS for v in increase)
        cells = [
            recipe,
            str(n_layer),
            str(len(seeds)),
            f"{loss:.3f}",
            f"{statistics.fmean(increase[:q]):.3f}",
            f"{statistics.fmean(increase[-q:]):.3f}",
            f"{increase[worst]:.3f} ({layers[worst]})",
            f"{statistics.fmean(angle[:q]):.3f}",
            f"{statistics.fmean(angle[-q:]):.3f}",
            f"{near_identity}/{len(layers)}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_depth_results(
    selections: dict[Arm, Selection],
    runs: dict[RunSpec, Path],
    table: list[dict],
    grid: list[dict],
    unigram: float | None,
    out_dir: Path,
    command: str,
    contribution_tokens: int,
) -> list[str]:
    """depth.md/.csv, depth_loss.png, depth_lr.png, stability_map.png, depth_grad_norms.png and the layer
    contribution (md, csv, png) at the picks; returns the names written."""
    from resnorm_lm.analysis import plots

    rows = depth_rows(table)
    with atomic_write(out_dir / "depth.md", "w") as f:
        f.write(depth_markdown(rows, unigram, command))
    write_csv_atomic(out_dir / "depth.csv", rows)
    plots.plot_depth_loss(table, unigram, out_dir)
    plots.plot_depth_lr(table, out_dir)
    plots.plot_stability_maps(grid, unigram, out_dir)
    written = ["depth.md", "depth.csv", "depth_loss.png", "depth_lr.png", "stability_map.png"]
    picked = {(sel.recipe, sel.n_layer): chosen_runs(sel, runs) for sel in selections.values()}
    picked = {key: pairs for key, pairs in picked.items() if pairs}
    if picked:  # one seed per pick: the lowest
        at_picks = {key: pairs[0][1] for key, pairs in picked.items()}
        plots.plot_depth_grad_norms(at_picks, out_dir)
        written.append("depth_grad_norms.png")
        if plots.plot_depth_stream_rms(at_picks, out_dir):
            written.append("depth_stream_rms.png")
    if contribution_tokens > 0 and picked:
        print(f"compare: layer contribution of {sum(map(len, picked.values()))} run(s) at the picks", flush=True)
        contribution, missing = contribution_rows(picked, contribution_tokens)
        if missing:
            print(
                f"compare: layer contribution: {len(missing)} run(s) have neither a checkpoint nor a cached "
                f"measurement and are left out: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}",
                file=sys.stderr,
            )
        if contribution:
            with atomic_write(out_dir / "layer_contribution.md", "w") as f:
                f.write(contribution_markdown(contribution))
            write_csv_atomic(out_dir / "layer_contribution.csv", contribution)
            plots.plot_layer_contribution(contribution, out_dir)
            written += ["layer_contribution.md", "layer_contribution.csv", "layer_contribution.png"]
    return written


if __name__ == "__main__":
    sys.exit(main())

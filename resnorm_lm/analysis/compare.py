"""``resnorm-lm compare`` / ``make compare``: a fair comparison of recipes, each at its own tuned setting.

    resnorm-lm compare --recipes prenorm-12l postnorm-12l --profile cpu \\
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

With ``--launcher slurm`` each run is a SLURM job (``slurm_jobs.py``; its options from the site's config file
and ``--slurm-*``): compare submits them, shows their progress, waits and writes the
same tables. Started again after an interruption, it submits only the runs that are neither finished nor queued
or running. docs/cluster.md walks through it.

With ``--depths 6 12 24 48`` each (recipe, depth) is its own comparison as above (its own grid, or
``--lrs-at DEPTH=LR,...``; its own pick, seeds and edge flag), trained with ``--model.arch.n_layer=N`` in
runs/<recipe>/<profile>-d<N>-lr<lr>-wu<w>-seed<k>; the recipe's own depth keeps the directories of a sweep
without depths. It adds depth.md/.csv, depth_loss.png, stability_map.png, depth_lr.png,
depth_grad_norms.png and the layer contribution at the picks (layer_contribution.md/.csv/.png,
``resnorm_lm.analysis.layer_contribution``). docs/depth.md describes them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from resnorm_lm.analysis.compare_report import (
    hardware_of,
    markdown_report,
    plot_comparison,
    write_depth_results,
    write_report,
)
from resnorm_lm.analysis.evaluate import PRECISIONS, RUN
from resnorm_lm.analysis.fit_processes import SweepTrainer
from resnorm_lm.analysis.layer_contribution import DEFAULT_TOKENS
from resnorm_lm.analysis.provenance import ProvenanceError, table_provenance
from resnorm_lm.analysis.slurm_jobs import CONFIG_ENV, SlurmError, SlurmOptions, SlurmSweepTrainer
from resnorm_lm.analysis.sweep import (
    depth_sort_key,
    ensure_picks_tested,
    grid_rows,
    recipe_row,
    run_sweep,
    sort_key,
    unigram_reference,
    write_tuned_overlays,
)
from resnorm_lm.train.loaded_run import CheckpointError
from resnorm_lm.train.precision import PrecisionError
from resnorm_lm.train.recipes import RecipeError, recipe_depth, recipe_path, resolve_profile

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


if __name__ == "__main__":
    sys.exit(main())

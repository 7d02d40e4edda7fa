"""``resnorm-lm compare`` / ``make compare``: a fair comparison of recipes, each at its own tuned setting.

    resnorm-lm compare --recipes prenorm-12l postnorm-12l --profile cpu \\
        --lrs 5e-4 1e-3 2e-3 --warmups 50 200 --seeds 1 2 3 [--jobs 2]

1. The grid: every recipe at every (peak lr, warmup) with the first seed (``--grid-seeds``).
2. Each recipe's setting is the one with the lowest mean validation loss over the seeds run at it
   (``resnorm_lm.sweep.select``); the chosen setting, and the runner-up when it lies within the seed
   spread, are then trained with every seed of ``--seeds`` and the choice is made again.
3. The test split is evaluated and reported only at each recipe's chosen setting.

Every (recipe, lr, warmup, seed) is its own run directory, runs/<recipe>/<profile>-lr<lr>-wu<w>-seed<k>
(without --lrs/--warmups: the recipe's own setting, runs/<recipe>/<profile>-seed<k>), trained when
missing, resumed when unfinished, reused when finished, so an interrupted sweep continues where it
stopped. Writes results/<profile>/compare.md and .csv (one row per recipe), grid.csv (one row per
recipe and setting), lr_sensitivity.png, loss_curves.png and grad_norms.png (at the chosen settings).
Runs whose validation loss stays within 0.1 nats of the unigram reference are flagged "not learning",
apart from "diverged".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from resnorm_lm.data.cache import atomic_write, write_csv_atomic
from resnorm_lm.evaluate import evaluate_paths
from resnorm_lm.recipes import RecipeError, recipe_path, resolve_profile, tuned_overlay
from resnorm_lm.runs import REPO_ROOT
from resnorm_lm.sweep import RunOutcome, RunSpec, Selection, estimate_seconds, expand_grid, grid_settings
from resnorm_lm.sweep import select as select_setting

TWELVE_LAYER_PLACEMENTS = [
    "prenorm-12l", "postnorm-12l", "sandwich-12l", "deepnorm-12l", "rezero-12l",
    "mixln-12l", "lns-12l", "b2t-12l", "resi_dual-12l", "noresidual-12l",
]  # fmt: skip
METRICS = ["loss", "ppl", "bpb"]


# ---------------------------------------------------------------------- run directories


def read_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "eval.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def run_state(run_dir: Path) -> str:
    """'finished' (eval.json from a completed fit), 'unfinished' (a checkpoint to resume) or 'missing'.

    A finished run stays finished when its checkpoints were deleted to save disk (or left behind on
    the machine that trained it): its eval.json holds its results. Only a split never evaluated on
    it then needs the checkpoint back (``ensure_evaluated`` says so).
    """
    if read_summary(run_dir).get("finished"):
        return "finished"
    return "unfinished" if has_checkpoint(run_dir) else "missing"


def has_checkpoint(run_dir: Path) -> bool:
    return (run_dir / "checkpoints" / "last.ckpt").is_file()


def seconds_per_step(root: Path, profile: str) -> tuple[float | None, int]:
    """Median training seconds per step of the finished runs of ``profile`` under ``root`` (and how many)."""
    rates = []
    for path in root.glob(f"*/{profile}-*/eval.json"):
        summary = json.loads(path.read_text())
        if summary.get("finished") and summary.get("wall_s") and summary.get("step"):
            rates.append(summary["wall_s"] / summary["step"])
    return (statistics.median(rates) if rates else None), len(rates)


# ---------------------------------------------------------------------- training


class SweepTrainer:
    """Trains run specs as subprocesses, ``jobs`` at a time (one GPU each where there are enough)."""

    def __init__(self, profile: str, root: str, extra: list[str], jobs: int) -> None:
        self.profile, self.root, self.extra, self.jobs = profile, root, extra, max(1, jobs)
        self.slots = list(range(self.jobs))
        self.lock = threading.Lock()
        gpus = torch.cuda.device_count()
        self.gpu_per_job = gpus >= self.jobs > 1

    def plan(self, specs: list[RunSpec], what: str, training: bool = True) -> list[RunSpec]:
        """Print how many runs there are to train and an estimate of the time; return those to train."""
        states = {spec: run_state(spec.run_dir(self.root, self.profile)) for spec in specs}
        todo = [s for s in specs if states[s] != "finished"]
        per_step, n_timed = seconds_per_step(Path(self.root), self.profile)
        max_steps = profile_max_steps(self.profile)
        eta = estimate_seconds(len(todo), max_steps, per_step, self.jobs)
        when = (
            f"about {eta / 60:.0f} min ({per_step:.2f} s/step measured over {n_timed} finished runs of this profile, "
            f"{max_steps} steps a run, {self.jobs} at a time)"
            if eta
            else "time unknown until a run of this profile has finished"
        )
        if not training:
            when = "not training them (--no-train)"
        resume = sum(states[s] == "unfinished" for s in todo)
        print(f"compare: {what}: {len(specs)} runs, {len(specs) - len(todo)} finished, {len(todo)} to train "
              f"({resume} to resume); {when if todo else 'nothing to train'}", flush=True)  # fmt: skip
        return todo

    def train_all(self, specs: list[RunSpec]) -> None:
        if self.jobs == 1:
            for spec in specs:
                self.train(spec, slot=0)
            return
        with ThreadPoolExecutor(self.jobs) as pool:
            list(pool.map(self._train_in_a_slot, specs))

    def _train_in_a_slot(self, spec: RunSpec) -> int:
        with self.lock:
            slot = self.slots.pop()
        try:
            return self.train(spec, slot)
        finally:
            with self.lock:
                self.slots.append(slot)

    def train(self, spec: RunSpec, slot: int) -> int:
        run_dir = spec.run_dir(self.root, self.profile)
        resume = run_state(run_dir) == "unfinished"
        cmd = [sys.executable, "-m", "resnorm_lm", "fit", "--recipe", spec.recipe, "--profile", self.profile,
               f"--seed_everything={spec.seed}", f"--run.root={self.root}", f"--run.tag={spec.setting.tag}",
               *spec.setting.overrides(), *(["--ckpt_path=last"] if resume else []), *self.extra]  # fmt: skip
        label = f"{spec.recipe} ({self.profile}, {spec.setting.describe()}, seed {spec.seed})"
        print(f"\ncompare: {'resuming' if resume else 'training'} {label}", flush=True)
        env = dict(os.environ)
        out = None
        if self.jobs > 1:  # parallel runs: one log file each instead of interleaved progress bars
            if self.gpu_per_job:
                env["CUDA_VISIBLE_DEVICES"] = str(slot)
            else:
                env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.jobs))
            run_dir.mkdir(parents=True, exist_ok=True)
            out = (run_dir / "train.log").open("a")
            cmd.append("--trainer.enable_progress_bar=false")
        try:
            code = subprocess.run(cmd, cwd=REPO_ROOT, env=env, stdout=out, stderr=out).returncode
        finally:
            if out is not None:
                out.close()
        if code != 0:
            print(f"compare: {label} ended with exit code {code}", file=sys.stderr, flush=True)
        elif self.jobs > 1:
            print(f"compare: finished {label} (log: {run_dir / 'train.log'})", flush=True)
        return code


def profile_max_steps(profile: str) -> int:
    import yaml

    from resnorm_lm.recipes import RECIPES_DIR

    config = yaml.safe_load((RECIPES_DIR / "profiles" / f"{profile}.yaml").read_text())
    return int(config.get("trainer", {}).get("max_steps") or 0)


# ---------------------------------------------------------------------- evaluation


def evaluated(run_dir: Path, split: str) -> dict[str, Any] | None:
    """The split's numbers from eval.json when they were measured on the run's final weights."""
    summary = read_summary(run_dir)
    ev = summary.get("eval") or {}
    if ev.get("step") == summary.get("step") and split in ev:
        return ev[split]
    return None


def ensure_evaluated(run_dirs: list[Path], split: str) -> None:
    """Evaluate (every token of ``split`` once) the runs that have not been evaluated at their last step."""
    todo = [d for d in run_dirs if evaluated(d, split) is None and not read_summary(d).get("diverged")]
    gone = [str(d) for d in todo if not has_checkpoint(d)]
    if gone:
        raise SystemExit(
            f"resnorm-lm compare: {len(gone)} finished run(s) need the {split} split evaluated but their "
            f"checkpoints are gone: {', '.join(gone[:3])}{' ...' if len(gone) > 3 else ''}. Put "
            f"checkpoints/last.ckpt back, or delete the run directory to retrain it."
        )
    if todo:
        evaluate_paths([str(d) for d in todo], [split], progress=False)


def outcome(spec: RunSpec, run_dir: Path) -> RunOutcome:
    summary = read_summary(run_dir)
    val = evaluated(run_dir, "validation")
    loss = val.get("loss") if val else None
    diverged = bool(summary.get("diverged")) or (loss is not None and not math.isfinite(loss))
    return RunOutcome(spec, None if diverged else loss, diverged)


def unigram_reference(run_dir: Path) -> float:
    """The unigram cross-entropy of the data the run trained on (its settings from the run's config.yaml)."""
    import yaml

    from resnorm_lm.data.datamodule import TextDataModule
    from resnorm_lm.data.unigram import unigram_cross_entropy

    data = yaml.safe_load((run_dir / "config.yaml").read_text())["data"]
    dm = TextDataModule(**data)
    dm.setup()
    return unigram_cross_entropy(dm.prepared)


# ---------------------------------------------------------------------- the sweep


def finished_dirs(specs: list[RunSpec], root: str, profile: str) -> dict[RunSpec, Path]:
    dirs = {s: s.run_dir(root, profile) for s in specs}
    return {s: d for s, d in dirs.items() if run_state(d) == "finished"}


def run_sweep(args, profile: str, trainer: SweepTrainer) -> tuple[dict[str, Selection], dict[RunSpec, Path]]:
    """Grid with the grid seeds, then every seed at the chosen settings, until the choice is stable."""
    settings = grid_settings(args.lrs, args.warmups)
    specs = expand_grid(args.recipes, settings, args.grid_seeds)
    # every finished run of the grid counts, whichever round trained it (seeds of an earlier pick included)
    everything = expand_grid(args.recipes, settings, sorted(set(args.grid_seeds) | set(args.seeds)))
    selections: dict[str, Selection] = {}
    for round_ in range(4):  # the choice can move when more seeds come in; it settles within a few rounds
        what = "grid" if round_ == 0 else f"seeds at the chosen settings (round {round_})"
        todo = trainer.plan(specs, what, training=not args.no_train)
        if not args.no_train:
            trainer.train_all(todo)
        runs = finished_dirs(everything, args.root, profile)
        ensure_evaluated(list(runs.values()), "validation")
        selections = {r: select_setting(r, [outcome(s, d) for s, d in runs.items() if s.recipe == r])
                      for r in args.recipes}  # fmt: skip
        wanted = {RunSpec(r, setting, seed) for r, sel in selections.items() for setting in sel.confirm
                  for seed in args.seeds}  # fmt: skip
        new = sorted(wanted - set(specs), key=lambda s: (s.recipe, s.setting, s.seed))
        if not new:
            break
        specs += new
    return selections, finished_dirs(everything, args.root, profile)


# ---------------------------------------------------------------------- the table


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None, None
    return statistics.fmean(finite), (statistics.stdev(finite) if len(finite) > 1 else 0.0)


def recipe_row(sel: Selection, runs: dict[RunSpec, Path], unigram: float | None) -> dict[str, Any]:
    """One table row: the chosen setting, validation and test over its seeds, flags, and the recipe's cost."""
    mine = {s: d for s, d in runs.items() if s.recipe == sel.recipe}
    summaries = [read_summary(d) for d in mine.values()]
    row: dict[str, Any] = {"recipe": sel.recipe, "n_runs": len(mine),
                           "train_s": round(sum(s.get("wall_s") or 0 for s in summaries), 1),
                           "unigram_loss": unigram}  # fmt: skip
    if sel.chosen is None:
        n_div = sum(sc.n_diverged for sc in sel.scores)
        row["status"] = f"diverged at every setting ({n_div} runs)" if sel.scores else "missing"
        return row
    setting = sel.chosen.setting
    chosen = {s: d for s, d in mine.items() if s.setting == setting}
    row.update(lr=setting.lr, warmup=setting.warmup, lr_edge=sel.lr_edge, n_seeds=len(chosen))
    ensure_evaluated(list(chosen.values()), "test")
    for split, prefix in (("validation", "val"), ("test", "test")):
        results = [evaluated(d, split) or {} for d in chosen.values()]
        for metric in METRICS:
            row[f"{prefix}_{metric}_mean"], row[f"{prefix}_{metric}_std"] = mean_std([r.get(metric) for r in results])
    facts = [read_summary(d) for d in chosen.values()]
    row["params"] = facts[0].get("params")
    row["tokens"] = facts[0].get("tokens")
    tps = [f["tokens"] / f["wall_s"] for f in facts if f.get("tokens") and f.get("wall_s")]
    row["tokens_per_s"] = statistics.fmean(tps) if tps else None
    stuck = [o for o in sel.chosen.outcomes if o.not_learning(unigram)]
    row["status"] = "not learning" if stuck else "ok"
    if stuck and len(stuck) < len(sel.chosen.outcomes):
        row["status"] = f"not learning {len(stuck)}/{len(sel.chosen.outcomes)}"
    return row


def grid_rows(selections: dict[str, Selection], unigram: float | None) -> list[dict[str, Any]]:
    """One row per recipe and setting: mean validation loss over the seeds run there, and its flags."""
    rows = []
    for recipe, sel in selections.items():
        for score in sorted(sel.scores, key=lambda s: s.setting):
            n, stuck = len(score.outcomes), sum(o.not_learning(unigram) for o in score.outcomes)
            flags = [f"{what} {count}/{n}" for what, count in (("diverged", score.n_diverged), ("not learning", stuck))
                     if count]  # fmt: skip
            # the loss shown is over the seeds that did not diverge; such a setting is never chosen (score.mean)
            rows.append({"recipe": recipe, "lr": score.setting.lr, "warmup": score.setting.warmup, "n_seeds": n,
                         "val_loss_mean": statistics.fmean(score.losses) if score.losses else None,
                         "val_loss_std": score.std if score.losses else None, "n_diverged": score.n_diverged,
                         "status": ", ".join(flags) or "ok",
                         "chosen": sel.chosen is not None and score.setting == sel.chosen.setting})  # fmt: skip
    return rows


def num(mean: float | None, std: float | None, digits: int = 3) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std else "")


def markdown_report(table: list[dict], grid: list[dict], profile: str, command: str, unigram: float | None,
                    hardware: str) -> str:  # fmt: skip
    runs = sum(r["n_runs"] for r in table)
    hours = sum(r["train_s"] for r in table) / 3600
    lines = [f"# Comparison: profile `{profile}`", "", f"Command: `{command}`", "",
             f"Date: {time.strftime('%Y-%m-%d')}. Hardware: {hardware}. Cost: {runs} runs, {hours:.2f} h of training.",
             "",
             "Each recipe at its own setting: the (peak lr, warmup) with the lowest mean validation loss over the "
             "seeds run at it; test is evaluated only at that setting. Mean ± standard deviation over seeds. "
             f"Unigram reference (validation cross-entropy of the train split's token frequencies): "
             f"{num(unigram, None)} nats; within {0.1} nats of it (or above) is 'not learning'.", "",
             "| recipe | lr | warmup | seeds | val loss | val ppl | val bpb | test ppl | test bpb | status |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in table:
        lr = "-" if r.get("lr") is None else f"{r['lr']:g}"
        lr += f" ({r['lr_edge']} of grid)" if r.get("lr_edge") else ""
        warmup = "-" if r.get("warmup") is None else str(r["warmup"])
        cells = [r["recipe"], lr, warmup, str(r.get("n_seeds", 0))]
        for key, digits in (("val_loss", 3), ("val_ppl", 1), ("val_bpb", 3), ("test_ppl", 1), ("test_bpb", 3)):
            cells.append(num(r.get(f"{key}_mean"), r.get(f"{key}_std"), digits))
        lines.append("| " + " | ".join([*cells, r["status"]]) + " |")
    if any(r.get("lr_edge") for r in table):
        lines += ["", "A chosen lr at the edge of the grid means the grid should be widened on that side."]
    lines += ["", "## The grid (validation loss, mean over the seeds run at each setting that did not diverge)", ""]
    lines += ["| recipe | lr | warmup | seeds | val loss | status | chosen |", "|---|---|---|---|---|---|---|"]
    for g in grid:
        lr = "recipe" if g["lr"] is None else f"{g['lr']:g}"
        warmup = "recipe" if g["warmup"] is None else str(g["warmup"])
        loss = num(g["val_loss_mean"], g["val_loss_std"])
        chosen = "yes" if g["chosen"] else ""
        lines.append(f"| {g['recipe']} | {lr} | {warmup} | {g['n_seeds']} | {loss} | {g['status']} | {chosen} |")
    return "\n".join(lines) + "\n"


def sort_key(row: dict[str, Any]) -> tuple:
    trained = row.get("val_loss_mean") is not None
    return (not trained, row["status"] != "ok", row.get("val_loss_mean") or math.inf)


def hardware_of(run_dirs: list[Path]) -> str:
    """The machines the runs were trained on, from their manifests (older manifests say less: used only alone)."""
    found: dict[str, bool] = {}  # description -> recorded by a newer manifest (CPU model and bf16 known)
    for run_dir in run_dirs:
        path = run_dir / "manifest.json"
        if not path.is_file():
            continue
        hw = json.loads(path.read_text()).get("hardware", {})
        if hw.get("gpus"):
            found[", ".join(hw["gpus"])] = True
            continue
        bf16 = {True: ", native bf16", False: ", no native bf16"}.get(hw.get("cpu_native_bf16"), "")
        found[f"{hw.get('cpu', 'CPU')} ({hw.get('cpu_count')} cores{bf16}, no GPU)"] = bool(bf16)
    described = sorted(d for d, full in found.items() if full) or sorted(found)
    return "; ".join(described) or "unknown"


def command_line(args, profile: str) -> str:
    parts = [f'make compare RECIPES="{" ".join(args.recipes)}" PROFILE={profile}']
    if args.lrs:
        parts.append(f'LRS="{" ".join(f"{x:g}" for x in args.lrs)}"')
    if args.warmups:
        parts.append(f'WARMUPS="{" ".join(map(str, args.warmups))}"')
    parts.append(f'SEEDS="{" ".join(map(str, args.seeds))}"')
    extra = []  # what else the runs need to be reproduced: where they live, how they were trained
    if args.root != "runs":
        extra.append(f"--root {args.root}")
    if args.train_args:
        extra.append(f'--train-args="{args.train_args}"')
    if extra:
        parts.append(f"ARGS='{' '.join(extra)}'")
    return " ".join(parts)


def write_tuned_overlays(table: list[dict], grid: list[dict], out_dir: Path, profile: str, command: str,
                         hardware: str) -> None:  # fmt: skip
    """``<results>/<profile>/tuned/<recipe>.yaml`` for every recipe with a chosen lr and warmup: copied into
    ``recipes/tuned/<profile>/``, it becomes that recipe's default at that profile."""
    for row in table:
        if row.get("lr") is None:
            continue
        evidence = [command, f"{hardware}, {time.strftime('%Y-%m-%d')}. Validation loss (mean over seeds):"]
        for g in grid:
            if g["recipe"] == row["recipe"]:
                mark = "  <- chosen" if g["chosen"] else ""
                warmup = "the recipe's" if g["warmup"] is None else g["warmup"]
                evidence.append(f"lr {g['lr']:g}, warmup {warmup}, {g['n_seeds']} seed(s): "
                                f"{num(g['val_loss_mean'], g['val_loss_std'])} ({g['status']}){mark}")  # fmt: skip
        if row.get("lr_edge"):
            evidence.append(f"the chosen lr is the {row['lr_edge']} of the grid: widen it on that side")
        out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_write(out_dir / f"{row['recipe']}.yaml", "w") as f:
            warmup = None if row.get("warmup") is None else int(row["warmup"])
            f.write(tuned_overlay(row["recipe"], profile, row["lr"], warmup, evidence))


# ---------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="resnorm-lm compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--recipes", nargs="+", default=TWELVE_LAYER_PLACEMENTS)
    parser.add_argument("--profile", default="auto")
    parser.add_argument(
        "--lrs", nargs="*", type=float, default=None, help="peak learning rates (default: the recipe's)"
    )
    parser.add_argument("--warmups", nargs="*", type=int, default=None, help="warmup steps (default: the recipe's)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1], help="seeds at each chosen setting")
    parser.add_argument("--grid-seeds", nargs="+", type=int, default=None,
                        help="seeds across the whole grid (default: the first of --seeds)")  # fmt: skip
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs trained at once (one GPU each where there are enough)"
    )
    parser.add_argument("--root", default="runs", help="where the runs live")
    parser.add_argument("--results", default="results", help="where tables and plots go: <results>/<profile>/")
    parser.add_argument("--no-train", action="store_true", help="only evaluate and tabulate runs that exist")
    parser.add_argument("--train-args", default="", help="extra LightningCLI overrides for the training runs")
    args = parser.parse_args(argv)
    args.lrs = args.lrs or None
    args.warmups = args.warmups or None
    args.grid_seeds = args.grid_seeds or args.seeds[:1]
    for lr in args.lrs or []:
        if not lr > 0:
            parser.error(f"--lrs: every learning rate must be > 0, got {lr:g}")
    for warmup in args.warmups or []:
        if warmup < 0:
            parser.error(f"--warmups: every warmup must be >= 0, got {warmup}")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    return args


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
    trainer = SweepTrainer(profile, args.root, args.train_args.split(), args.jobs)
    selections, runs = run_sweep(args, profile, trainer)
    if not runs:
        print("resnorm-lm compare: no finished runs to compare", file=sys.stderr)
        return 1
    unigram = unigram_reference(next(iter(runs.values())))
    table = sorted((recipe_row(sel, runs, unigram) for sel in selections.values()), key=sort_key)
    grid = grid_rows(selections, unigram)
    out_dir = Path(args.results) / profile
    out_dir.mkdir(parents=True, exist_ok=True)
    report = markdown_report(
        table, grid, profile, command_line(args, profile), unigram, hardware_of(list(runs.values()))
    )
    with atomic_write(out_dir / "compare.md", "w") as f:
        f.write(report)
    write_csv_atomic(out_dir / "compare.csv", table)
    write_csv_atomic(out_dir / "grid.csv", grid)
    write_tuned_overlays(table, grid, out_dir / "tuned", profile, command_line(args, profile),
                         hardware_of(list(runs.values())))  # fmt: skip
    from resnorm_lm.plots import plot_grad_norms, plot_loss_curves, plot_lr_sensitivity

    at_chosen = {r: [d for s, d in runs.items() if s.recipe == r and sel.chosen and s.setting == sel.chosen.setting]
                 for r, sel in selections.items()}  # fmt: skip
    at_chosen = {r: dirs for r, dirs in at_chosen.items() if dirs}
    if args.lrs:
        plot_lr_sensitivity(grid, unigram, out_dir)
    else:
        print("compare: no LRS grid: lr_sensitivity.png not drawn")
    if at_chosen:
        plot_loss_curves(at_chosen, out_dir)
        plot_grad_norms(at_chosen, out_dir)
    print("\n" + report)
    print(f"compare: wrote {out_dir}/compare.md, compare.csv, grid.csv, plots and tuned/<recipe>.yaml (copy one "
          f"into recipes/tuned/{profile}/ to make it the default) in {time.time() - started:.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``resnorm-lm compare`` / ``make compare``: a fair comparison of recipes, each at its own tuned setting.

    resnorm-lm compare --recipes prenorm-12l postnorm-12l --profile cpu \\
        --lrs 5e-4 1e-3 2e-3 --warmups 50 200 --seeds 1 2 3 [--jobs 2]

1. The grid: every recipe at every (peak lr, warmup) with the first seed (``--grid-seeds``).
2. Each recipe's setting is the one with the lowest mean validation loss over the seeds run at it
   (``resnorm_lm.analysis.sweep.select``); the chosen setting, and the runner-up when it lies within the seed
   spread, are then trained with every seed of ``--seeds`` and the choice is made again.
3. The test split is evaluated and reported only at each recipe's chosen setting.

Runs are evaluated at the precision each trained with (``--eval-precision 32-true`` for fp32); the tables
say which precision their numbers were measured at.

Every (recipe, lr, warmup, seed) is its own run directory, runs/<recipe>/<profile>-lr<lr>-wu<w>-seed<k>
(without --lrs/--warmups: the recipe's own setting, runs/<recipe>/<profile>-seed<k>), trained when
missing, resumed when unfinished, reused when finished, so an interrupted sweep continues where it
stopped. Writes results/<profile>/compare.md and .csv (one row per recipe), grid.csv (one row per
recipe and setting), lr_sensitivity.png, loss_curves.png and grad_norms.png (at the chosen settings).
Runs whose validation loss stays within 0.1 nats of the unigram reference are flagged "not learning",
apart from "diverged".

With ``--depths 6 12 24 48`` each (recipe, depth) is its own comparison as above (its own grid, or
``--lrs-at DEPTH=LR,...``; its own pick, seeds and edge flag), trained with ``--model.arch.n_layer=N`` in
runs/<recipe>/<profile>-d<N>-lr<lr>-wu<w>-seed<k>; the recipe's own depth keeps the directories of a sweep
without depths. It adds depth.md/.csv, depth_loss.png, stability_map.png, depth_lr.png,
depth_grad_norms.png and the layer contribution at the picks (layer_contribution.md/.csv/.png,
``resnorm_lm.analysis.layer_contribution``). docs/depth.md describes them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from resnorm_lm.analysis.evaluate import PRECISIONS, RUN, eval_precision, evaluate_paths
from resnorm_lm.analysis.layer_contribution import DEFAULT_TOKENS, block_means, group_rows
from resnorm_lm.analysis.sweep import (
    NOT_LEARNING_NATS,
    Arm,
    RunOutcome,
    RunSpec,
    Selection,
    estimate_seconds,
    expand_grid,
    grid_settings,
)
from resnorm_lm.analysis.sweep import select as select_setting
from resnorm_lm.data.cache import atomic_write, write_csv_atomic
from resnorm_lm.train.loaded_run import CheckpointError
from resnorm_lm.train.precision import PrecisionError, uses_cuda
from resnorm_lm.train.recipes import (
    RecipeError,
    recipe_at_depth,
    recipe_depth,
    recipe_path,
    resolve_profile,
    tuned_overlay,
)
from resnorm_lm.train.runs import REPO_ROOT

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


def run_config(run_dir: Path) -> dict[str, Any]:
    """The configuration a run trained with (its ``config.yaml``, as LightningCLI saved it)."""
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text()) or {}


def run_init(run_dir: Path) -> str | None:
    """The weight init a run trained from (``model.arch.init``; runs from before it was named: gpt2), or None
    where the run has no config.yaml."""
    if not (run_dir / "config.yaml").is_file():
        return None
    return ((run_config(run_dir).get("model") or {}).get("arch") or {}).get("init", "gpt2")


def step_seconds_by_blocks(root: Path, profile: str) -> dict[int, list[float]]:
    """Training seconds per step of the finished runs of ``profile`` under ``root``, by their number of blocks."""
    rates: dict[int, list[float]] = {}
    for path in root.glob(f"*/{profile}-*/eval.json"):
        summary = json.loads(path.read_text())
        timed = summary.get("finished") and summary.get("wall_s") and summary.get("step")
        if not (timed and (path.parent / "config.yaml").is_file()):
            continue
        n_layer = ((run_config(path.parent).get("model") or {}).get("arch") or {}).get("n_layer")
        if n_layer:
            rates.setdefault(int(n_layer), []).append(summary["wall_s"] / summary["step"])
    return rates


def step_seconds_at(n_layer: int, rates: dict[int, list[float]]) -> tuple[float | None, int | None]:
    """The median seconds per step of the timed runs of ``n_layer`` blocks, and that depth. Without any, those
    of the nearest depth timed, scaled in proportion to the blocks (which overstates the change: the embedding
    and head stay the same); (None, None) when no run has been timed."""
    if not rates:
        return None, None
    nearest = min(rates, key=lambda n: (abs(n - n_layer), n))
    return statistics.median(rates[nearest]) * n_layer / nearest, nearest


def timing_line(blocks: list[int], rates: dict[int, list[float]]) -> str:
    """'0.52 at 6 blocks, 3.48 at 48 blocks (scaled from 24)': the seconds per step an estimate used."""
    parts = []
    for n in blocks:
        seconds, timed = step_seconds_at(n, rates)
        parts.append(f"{seconds:.2f} at {n} blocks" + ("" if timed == n else f" (scaled from {timed})"))
    return ", ".join(parts)


# ---------------------------------------------------------------------- training


class SweepTrainer:
    """Trains run specs as subprocesses, ``jobs`` at a time (one GPU each where there are enough)."""

    def __init__(self, profile: str, root: str, extra: list[str], jobs: int) -> None:
        self.profile, self.root, self.extra, self.jobs = profile, root, extra, max(1, jobs)
        self.slots = list(range(self.jobs))
        self.lock = threading.Lock()
        gpus = torch.cuda.device_count()
        self.gpu_per_job = gpus >= self.jobs > 1
        self.prepared: set[str] = set()  # data settings prepared by prepare_data (as JSON)

    def plan(self, specs: list[RunSpec], what: str, training: bool = True) -> list[RunSpec]:
        """Print how many runs there are to train and an estimate of the time; return those to train."""
        states = {spec: run_state(spec.run_dir(self.root, self.profile)) for spec in specs}
        todo = [s for s in specs if states[s] != "finished"]
        rates = step_seconds_by_blocks(Path(self.root), self.profile)
        own = {recipe: recipe_depth(recipe, self.profile) for recipe in {spec.recipe for spec in todo}}
        blocks = [spec.depth or own[spec.recipe] for spec in todo]
        max_steps = profile_max_steps(self.profile)
        eta = estimate_seconds([step_seconds_at(n, rates)[0] for n in blocks], max_steps, self.jobs)
        when = (
            f"about {eta / 60:.0f} min (s/step measured over {sum(map(len, rates.values()))} finished runs of this "
            f"profile: {timing_line(sorted(set(blocks)), rates)}; {max_steps} steps a run, {self.jobs} at a time)"
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
        self.prepare_data(specs)
        with ThreadPoolExecutor(self.jobs) as pool:
            list(pool.map(self._train_in_a_slot, specs))

    def prepare_data(self, specs: list[RunSpec]) -> None:
        """Prepare the data of ``specs`` here, once, before parallel jobs start: on a cold cache they would
        otherwise all build the same corpus at once (safe, but each would wait for or repeat the work)."""
        from resnorm_lm.data.datamodule import TextDataModule
        from resnorm_lm.data.errors import DataError

        wanted = {}  # a setting's JSON -> the data settings; recipes of one profile usually share one
        for recipe in dict.fromkeys(spec.recipe for spec in specs):
            data = data_settings(recipe, self.profile, self.extra)
            if data is not None:  # a config error: each job reports it in its log
                wanted.setdefault(json.dumps(data, sort_keys=True), data)
        todo = [data for key, data in wanted.items() if key not in self.prepared]
        if not todo:
            return
        print(f"compare: preparing the data before the {self.jobs} parallel jobs start", flush=True)
        with working_directory(REPO_ROOT):  # where the jobs run: relative data.files and cache_dir mean the same
            for data in todo:
                try:
                    TextDataModule(**data).prepare_data()
                except (DataError, ValueError) as err:
                    raise SystemExit(f"resnorm-lm compare: error: preparing the data: {err}") from None
        self.prepared.update(json.dumps(data, sort_keys=True) for data in todo)

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
               f"--seed_everything={spec.seed}", f"--run.root={self.root}", f"--run.tag={spec.tag}",
               *spec.overrides(), *(["--ckpt_path=last"] if resume else []), *self.extra]  # fmt: skip
        depth = "" if spec.depth is None else f", {spec.depth} layers"
        label = f"{spec.recipe} ({self.profile}{depth}, {spec.setting.describe()}, seed {spec.seed})"
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


def data_settings(recipe: str, profile: str, extra: list[str]) -> dict[str, Any] | None:
    """The ``data`` section that ``fit --recipe <recipe> --profile <profile> <extra>`` resolves to, from
    LightningCLI's own ``--print_config`` run in this process (None when the arguments do not parse)."""
    import io
    from unittest import mock

    import yaml

    from resnorm_lm.train.lightning_cli import ResnormCLI
    from resnorm_lm.train.recipes import expand_recipe_arguments

    args = expand_recipe_arguments(["fit", "--recipe", recipe, "--profile", profile, *extra, "--print_config"])
    printed = io.StringIO()
    # sys.argv is compare's own command line: LightningCLI would warn that it differs from args
    with mock.patch.object(sys, "argv", sys.argv[:1]), contextlib.redirect_stdout(printed):
        with contextlib.suppress(SystemExit):  # --print_config exits once printed
            ResnormCLI(args=args)
    config = yaml.safe_load(printed.getvalue() or "null")
    return config.get("data") if isinstance(config, dict) else None


@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    """``contextlib.chdir`` of Python 3.11."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def profile_max_steps(profile: str) -> int:
    import yaml

    from resnorm_lm.train.recipes import RECIPES_DIR

    config = yaml.safe_load((RECIPES_DIR / "profiles" / f"{profile}.yaml").read_text())
    return int(config.get("trainer", {}).get("max_steps") or 0)


# ---------------------------------------------------------------------- evaluation


def evaluated(run_dir: Path, split: str, precision: str = RUN) -> dict[str, Any] | None:
    """The split's numbers from eval.json when they were measured on the run's final weights, at the precision
    ``precision`` asks for (``eval_precision``). Numbers measured at another precision, or before eval.json
    recorded it, are measured again where the checkpoint is there; without it they are used as they are
    (the tables show their precision, or "not recorded")."""
    summary = read_summary(run_dir)
    ev = summary.get("eval") or {}
    if ev.get("step") != summary.get("step") or split not in ev:
        return None
    wanted = eval_precision(precision, ev.get("trained_precision"), uses_cuda("auto")).precision
    if ev.get("precision") == wanted or not has_checkpoint(run_dir):
        return ev[split]
    return None


def eval_precisions(run_dirs: list[Path]) -> str | None:
    """The precisions the runs' recorded evaluations ran at, for the tables."""
    found = {ev.get("precision") or "not recorded" for d in run_dirs if (ev := read_summary(d).get("eval"))}
    return ", ".join(sorted(found)) or None


def ensure_evaluated(run_dirs: list[Path], split: str, precision: str = RUN) -> None:
    """Evaluate (every token of ``split`` once) the runs not yet evaluated at their last step and at ``precision``."""
    todo = [d for d in run_dirs if evaluated(d, split, precision) is None and not read_summary(d).get("diverged")]
    gone = [str(d) for d in todo if not has_checkpoint(d)]
    if gone:
        raise SystemExit(
            f"resnorm-lm compare: {len(gone)} finished run(s) need the {split} split evaluated but their "
            f"checkpoints are gone: {', '.join(gone[:3])}{' ...' if len(gone) > 3 else ''}. Put "
            f"checkpoints/last.ckpt back, or delete the run directory to retrain it."
        )
    if todo:
        evaluate_paths([str(d) for d in todo], [split], precision=precision, progress=False)


def outcome(spec: RunSpec, run_dir: Path, precision: str = RUN) -> RunOutcome:
    summary = read_summary(run_dir)
    val = evaluated(run_dir, "validation", precision)
    loss = val.get("loss") if val else None
    diverged = bool(summary.get("diverged")) or (loss is not None and not math.isfinite(loss))
    return RunOutcome(spec, None if diverged else loss, diverged)


def unigram_reference(run_dir: Path) -> float:
    """The unigram cross-entropy of the data the run trained on (its settings from the run's config.yaml)."""
    from resnorm_lm.data.datamodule import TextDataModule
    from resnorm_lm.data.unigram import unigram_cross_entropy

    data = run_config(run_dir)["data"]
    dm = TextDataModule(**data)
    dm.setup()
    return unigram_cross_entropy(dm.prepared)


# ---------------------------------------------------------------------- the sweep


def finished_dirs(specs: list[RunSpec], root: str, profile: str) -> dict[RunSpec, Path]:
    dirs = {s: s.run_dir(root, profile) for s in specs}
    return {s: d for s, d in dirs.items() if run_state(d) == "finished"}


def sweep_arms(recipes: list[str], depths: list[int] | None, profile: str) -> dict[Arm, int]:
    """Each (recipe, depth) to compare, with its number of blocks. A depth equal to the recipe's own is no
    override: its runs are the recipe's own, named as a sweep without depths names them (and reused)."""
    arms = {}
    for recipe in recipes:
        own = recipe_depth(recipe, profile)
        for depth in depths or [own]:
            arms[Arm(recipe, None if depth == own else depth)] = depth
    return arms


def run_sweep(args, profile: str, trainer: SweepTrainer) -> tuple[dict[Arm, Selection], dict[RunSpec, Path]]:
    """Grid with the grid seeds, then every seed at the chosen settings, until the choice is stable; each
    (recipe, depth) on its own, over its own grid (``--lrs-at`` for a depth, else ``--lrs``)."""
    arms = sweep_arms(args.recipes, args.depths, profile)
    grids = {arm: grid_settings(args.lrs_at.get(n_layer, args.lrs), args.warmups) for arm, n_layer in arms.items()}
    specs = [s for arm, grid in grids.items() for s in expand_grid([arm.recipe], grid, args.grid_seeds, arm.depth)]
    # every finished run of the grid counts, whichever round trained it (seeds of an earlier pick included)
    seeds = sorted(set(args.grid_seeds) | set(args.seeds))
    everything = [s for arm, grid in grids.items() for s in expand_grid([arm.recipe], grid, seeds, arm.depth)]
    selections: dict[Arm, Selection] = {}
    # The choice can move when more seeds come in. Each round gives every seed to at least one more
    # (arm, setting) or ends, so it ends within as many rounds as the largest grid has settings, and then
    # the pick and every setting within its seed spread have had every seed.
    for round_ in range(max(map(len, grids.values())) + 1):
        what = "grid" if round_ == 0 else f"seeds at the chosen settings (round {round_})"
        todo = trainer.plan(specs, what, training=not args.no_train)
        if not args.no_train:
            trainer.train_all(todo)
        runs = finished_dirs(everything, args.root, profile)
        ensure_evaluated(list(runs.values()), "validation", args.eval_precision)
        outcomes = [(s.arm, outcome(s, d, args.eval_precision)) for s, d in runs.items()]
        selections = {arm: select_setting(arm.recipe, [o for a, o in outcomes if a == arm], arm.depth, n_layer)
                      for arm, n_layer in arms.items()}  # fmt: skip
        wanted = {RunSpec(arm.recipe, setting, seed, arm.depth) for arm, sel in selections.items()
                  for setting in sel.confirm for seed in args.seeds}  # fmt: skip
        new = sorted(wanted - set(specs), key=lambda s: (s.recipe, arms[s.arm], s.setting, s.seed))
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


def recipe_row(sel: Selection, runs: dict[RunSpec, Path], unigram: float | None,
               seeds_wanted: int | None = None, precision: str = RUN) -> dict[str, Any]:  # fmt: skip
    """One table row: the chosen setting, validation and test over its seeds, flags, and the recipe's cost.

    A pick with fewer finished seeds than ``seeds_wanted`` (runs not trained with --no-train, or failed) says
    so in its status: its mean is not comparable in weight with a full pick's."""
    mine = {s: d for s, d in runs.items() if s.arm == sel.arm}
    summaries = [read_summary(d) for d in mine.values()]
    row: dict[str, Any] = {"recipe": sel.recipe, "n_layer": sel.n_layer, "n_runs": len(mine),
                           "train_s": round(sum(s.get("wall_s") or 0 for s in summaries), 1),
                           "unigram_loss": unigram}  # fmt: skip
    if sel.chosen is None:
        n_div = sum(sc.n_diverged for sc in sel.scores)
        row["status"] = f"diverged at every setting ({n_div} runs)" if sel.scores else "missing"
        return row
    setting = sel.chosen.setting
    chosen = {s: d for s, d in mine.items() if s.setting == setting}
    row.update(lr=setting.lr, warmup=setting.warmup, lr_edge=sel.lr_edge, n_seeds=len(chosen))
    ensure_evaluated(list(chosen.values()), "test", precision)
    row["eval_precision"] = eval_precisions(list(chosen.values()))
    for split, prefix in (("validation", "val"), ("test", "test")):
        results = [evaluated(d, split, precision) or {} for d in chosen.values()]
        for metric in METRICS:
            row[f"{prefix}_{metric}_mean"], row[f"{prefix}_{metric}_std"] = mean_std([r.get(metric) for r in results])
    facts = [read_summary(d) for d in chosen.values()]
    row["init"] = ", ".join(sorted({i for i in map(run_init, chosen.values()) if i})) or None
    row["params"] = facts[0].get("params")
    row["tokens"] = facts[0].get("tokens")
    tps = [f["tokens"] / f["wall_s"] for f in facts if f.get("tokens") and f.get("wall_s")]
    row["tokens_per_s"] = statistics.fmean(tps) if tps else None
    stuck = [o for o in sel.chosen.outcomes if o.not_learning(unigram)]
    row["status"] = "not learning" if stuck else "ok"
    if stuck and len(stuck) < len(sel.chosen.outcomes):
        row["status"] = f"not learning {len(stuck)}/{len(sel.chosen.outcomes)}"
    if seeds_wanted and len(chosen) < seeds_wanted:
        row["status"] += f"; pick has {len(chosen)} of {seeds_wanted} seeds"
    return row


def grid_rows(
    selections: dict[Any, Selection], unigram: float | None, runs: dict[RunSpec, Path] | None = None
) -> list[dict[str, Any]]:
    """One row per recipe (at each depth) and setting: mean validation loss over the seeds run there, its flags,
    the mean fraction of steps whose gradient clip bound, and the precision it was evaluated at (from the
    ``runs``' eval.json)."""
    rows, runs = [], runs or {}
    for sel in selections.values():
        for score in sorted(sel.scores, key=lambda s: s.setting):
            n, stuck = len(score.outcomes), sum(o.not_learning(unigram) for o in score.outcomes)
            flags = [f"{what} {count}/{n}" for what, count in (("diverged", score.n_diverged), ("not learning", stuck))
                     if count]  # fmt: skip
            # the loss shown is over the seeds that did not diverge; such a setting is never chosen (score.mean)
            clips = [read_summary(runs[o.spec]).get("clip") for o in score.outcomes if o.spec in runs]
            clipped = [c["clipped_fraction"] for c in clips if c]  # runs from before the record have none
            rows.append({"recipe": sel.recipe, "n_layer": sel.n_layer, "lr": score.setting.lr,
                         "warmup": score.setting.warmup, "n_seeds": n,
                         "val_loss_mean": statistics.fmean(score.losses) if score.losses else None,
                         "val_loss_std": score.std if score.losses else None, "n_diverged": score.n_diverged,
                         "status": ", ".join(flags) or "ok",
                         "clipped_mean": statistics.fmean(clipped) if clipped else None,
                         "eval_precision": eval_precisions([runs[o.spec] for o in score.outcomes if o.spec in runs]),
                         "chosen": sel.chosen is not None and score.setting == sel.chosen.setting})  # fmt: skip
    return rows


def num(mean: float | None, std: float | None, digits: int = 3) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std else "")


def markdown_report(table: list[dict], grid: list[dict], profile: str, command: str, unigram: float | None,
                    hardware: str, depths: bool = False) -> str:  # fmt: skip
    """compare.md; with ``depths`` a "layers" column after the recipe says which depth each row is."""
    runs = sum(r["n_runs"] for r in table)
    hours = sum(r["train_s"] for r in table) / 3600
    lines = [f"# Comparison: profile `{profile}`", "", f"Command: `{command}`", "",
             f"Date: {time.strftime('%Y-%m-%d')}. Hardware: {hardware}. Cost: {runs} runs, {hours:.2f} h of training.",
             "",
             "Each recipe at its own setting: the (peak lr, warmup) with the lowest mean validation loss over the "
             "seeds run at it; test is evaluated only at that setting. Mean ± standard deviation over seeds. "
             f"Unigram reference (validation cross-entropy of the train split's token frequencies): "
             f"{num(unigram, None)} nats; within {NOT_LEARNING_NATS} nats of it (or above) is 'not learning'.", "",
             "Eval precision: the precision the numbers were measured at (by default each run's training "
             "precision; `--eval-precision` to choose).", "",
             "| recipe | lr | warmup | seeds | val loss | val ppl | val bpb | test ppl | test bpb | eval precision "
             "| status |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    if depths:
        lines[-2:] = [with_layers(line, "layers") for line in lines[-2:]]
    for r in table:
        lr = "-" if r.get("lr") is None else f"{r['lr']:g}"
        lr += f" ({r['lr_edge']} of grid)" if r.get("lr_edge") else ""
        warmup = "-" if r.get("warmup") is None else str(r["warmup"])
        cells = [r["recipe"], lr, warmup, str(r.get("n_seeds", 0))]
        for key, digits in (("val_loss", 3), ("val_ppl", 1), ("val_bpb", 3), ("test_ppl", 1), ("test_bpb", 3)):
            cells.append(num(r.get(f"{key}_mean"), r.get(f"{key}_std"), digits))
        line = "| " + " | ".join([*cells, r.get("eval_precision") or "-", r["status"]]) + " |"
        lines.append(with_layers(line, r.get("n_layer")) if depths else line)
    inits = {r["recipe"]: r["init"] for r in table if r.get("init")}
    if len(set(inits.values())) == 1:
        lines += ["", f"Init: `{next(iter(inits.values()))}` in every run (`model.arch.init`)."]
    elif inits:
        lines += ["", "Init (`model.arch.init`): " + "; ".join(f"{r} `{i}`" for r, i in inits.items()) + "."]
    if any(r.get("lr_edge") for r in table):
        lines += ["", "A chosen lr at the edge of the grid means the grid should be widened on that side."]
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


def sort_key(row: dict[str, Any]) -> tuple:
    trained = row.get("val_loss_mean") is not None
    return (not trained, row["status"] != "ok", row.get("val_loss_mean") or math.inf)


def depth_sort_key(row: dict[str, Any]) -> tuple:
    """With a depth axis: depth by depth, each ranked as without one."""
    return (row.get("n_layer") or 0, *sort_key(row))


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
    if getattr(args, "eval_precision", RUN) != RUN:
        extra.append(f"--eval-precision {args.eval_precision}")
    if extra:
        parts.append(f"ARGS='{' '.join(extra)}'")
    return " ".join(parts)


def tuned_names(table: list[dict], own_depths: dict[str, int]) -> dict[int, str]:
    """The overlay name of each row (by index): the recipe at its own depth, else the recipe the naming rule
    gives that depth (prenorm-12l at 24 blocks: prenorm-24l). A depth row whose name is a recipe compared at
    its own depth in the same table gets none: that recipe's own runs decide its overlay."""
    names = {}
    for i, row in enumerate(table):
        own = row.get("n_layer") in (None, own_depths.get(row["recipe"]))
        names[i] = row["recipe"] if own else recipe_at_depth(row["recipe"], row["n_layer"])
    compared = {row["recipe"] for i, row in enumerate(table) if names[i] == row["recipe"]}
    return {i: name for i, name in names.items() if name == table[i]["recipe"] or name not in compared}


def write_tuned_overlays(table: list[dict], grid: list[dict], out_dir: Path, profile: str, command: str,
                         hardware: str, own_depths: dict[str, int] | None = None) -> None:  # fmt: skip
    """``<results>/<profile>/tuned/<recipe>.yaml`` for every recipe with a chosen lr and warmup: copied into
    ``recipes/tuned/<profile>/``, it becomes that recipe's default at that profile. A recipe compared at
    another depth gives the overlay of the recipe of that depth (``tuned_names``)."""
    names = tuned_names(table, own_depths or {})
    for i, row in enumerate(table):
        if row.get("lr") is None or i not in names:
            continue
        evidence = [command, f"{hardware}, {time.strftime('%Y-%m-%d')}. Validation loss (mean over seeds):"]
        if names[i] != row["recipe"]:
            evidence.insert(1, f"measured as {row['recipe']} at {row['n_layer']} blocks (--model.arch.n_layer)")
        for g in grid:
            if g["recipe"] == row["recipe"] and g.get("n_layer") == row.get("n_layer"):
                mark = "  <- chosen" if g["chosen"] else ""
                warmup = "the recipe's" if g["warmup"] is None else g["warmup"]
                evidence.append(f"lr {g['lr']:g}, warmup {warmup}, {g['n_seeds']} seed(s): "
                                f"{num(g['val_loss_mean'], g['val_loss_std'])} ({g['status']}){mark}")  # fmt: skip
        if row.get("lr_edge"):
            evidence.append(f"the chosen lr is the {row['lr_edge']} of the grid: widen it on that side")
        out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_write(out_dir / f"{names[i]}.yaml", "w") as f:
            warmup = None if row.get("warmup") is None else int(row["warmup"])
            f.write(tuned_overlay(names[i], profile, row["lr"], warmup, evidence))


# ---------------------------------------------------------------------- the depth axis


def arm_label(sel: Selection, depths: bool) -> str:
    """How figures name a (recipe, depth): the recipe, and its depth on a depth axis."""
    return f"{sel.recipe}, {sel.n_layer} blocks" if depths else sel.recipe


def chosen_runs(sel: Selection, runs: dict[RunSpec, Path]) -> list[tuple[RunSpec, Path]]:
    """The finished runs of an arm at its chosen setting, by seed."""
    if sel.chosen is None:
        return []
    mine = [(s, d) for s, d in runs.items() if s.arm == sel.arm and s.setting == sel.chosen.setting]
    return sorted(mine, key=lambda pair: pair[0].seed)


def depth_rows(table: list[dict]) -> list[dict]:
    """depth.csv: each (recipe, depth) at its pick, with its size and the tokens it saw per parameter."""
    keys = ["recipe", "n_layer", "params", "tokens", "lr", "warmup", "lr_edge", "n_seeds", "val_loss_mean",
            "val_loss_std", "test_loss_mean", "test_loss_std", "status"]  # fmt: skip
    rows = []
    for r in sorted(table, key=lambda r: (r["recipe"], r.get("n_layer") or 0)):
        row = {k: r.get(k) for k in keys}
        row["tokens_per_param"] = r["tokens"] / r["params"] if r.get("tokens") and r.get("params") else None
        rows.append(row)
    return rows


def depth_markdown(rows: list[dict], unigram: float | None, command: str) -> str:
    """depth.md: validation loss at each pick, a recipe per line and a depth per column, and the sizes."""
    depths = sorted({r["n_layer"] for r in rows if r.get("n_layer")})
    lines = ["# Depth: each recipe tuned at each depth", "", f"Command: `{command}`", "",
             "Validation loss at each (recipe, depth)'s own chosen LR (mean ± std over the seeds at the pick), "
             "and the LR. Every depth trains on the same tokens, so a deeper model has more parameters per "
             f"token. Unigram reference: {num(unigram, None)} nats.", "",
             "| recipe | " + " | ".join(f"depth {d}" for d in depths) + " |",
             "|---" * (len(depths) + 1) + "|"]  # fmt: skip
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
            sizes.append(f"{depth} blocks: {span} parameters, {at[0]['tokens']:,} tokens "
                         f"({at[0]['tokens'] / params[-1]:.2f} tokens per parameter)")  # fmt: skip
    if sizes:
        lines += ["", "Sizes (parameters counted once, embeddings included; tokens seen in training):", ""]
        lines += [f"- {line}" for line in sizes]
    return "\n".join(lines) + "\n"


def contribution_rows(picked: dict[tuple[str, int], list[tuple[RunSpec, Path]]],
                      n_tokens: int) -> tuple[list[dict], list[str]]:  # fmt: skip
    """layer_contribution.csv: a row per (recipe, depth, seed, block), measured on the runs at the picks;
    and the runs that could not be measured (no checkpoint and no cached measurement)."""
    from resnorm_lm.analysis.layer_contribution import run_contribution

    rows, missing = [], []
    for (recipe, n_layer), pairs in sorted(picked.items()):
        for spec, run_dir in pairs:
            record = run_contribution(run_dir, n_tokens)
            if record is None:
                missing.append(str(run_dir))
                continue
            per_block = zip(record["skipped_loss"], record["loss_increase"], record["angular_distance"])
            for layer, (skipped, increase, angle) in enumerate(per_block):
                rows.append({"recipe": recipe, "n_layer": n_layer, "seed": spec.seed, "layer": layer,
                             "tokens": record["tokens"], "loss": record["loss"], "loss_skipped": skipped,
                             "loss_increase": increase, "angular_distance": angle})  # fmt: skip
    return rows, missing


NEAR_IDENTITY_NATS = 0.01  # a block whose removal costs less than this does next to nothing


def contribution_markdown(rows: list[dict]) -> str:
    """layer_contribution.md: per (recipe, depth), means over seeds of the per-block numbers, summarised by
    the first and last quarter of the blocks (every block's numbers are in the CSV)."""
    tokens = sorted({r["tokens"] for r in rows})
    lines = ["# Layer contribution at the chosen runs", "",
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
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (recipe, n_layer), mine in sorted(group_rows(rows, ("recipe", "n_layer")).items()):
        seeds = sorted({r["seed"] for r in mine})
        layers, increase = block_means(mine, "loss_increase")
        _, angle = block_means(mine, "angular_distance")
        q = math.ceil(len(layers) / 4)
        worst = max(range(len(layers)), key=lambda i: increase[i])
        loss = statistics.fmean(r["loss"] for r in mine if r["layer"] == 0)
        near_identity = sum(v < NEAR_IDENTITY_NATS for v in increase)
        cells = [recipe, str(n_layer), str(len(seeds)), f"{loss:.3f}", f"{statistics.fmean(increase[:q]):.3f}",
                 f"{statistics.fmean(increase[-q:]):.3f}", f"{increase[worst]:.3f} ({layers[worst]})",
                 f"{statistics.fmean(angle[:q]):.3f}", f"{statistics.fmean(angle[-q:]):.3f}",
                 f"{near_identity}/{len(layers)}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_depth_results(selections: dict[Arm, Selection], runs: dict[RunSpec, Path], table: list[dict],
                        grid: list[dict], unigram: float | None, out_dir: Path, command: str,
                        contribution_tokens: int) -> list[str]:  # fmt: skip
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
            print(f"compare: layer contribution: {len(missing)} run(s) have neither a checkpoint nor a cached "
                  f"measurement and are left out: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}",
                  file=sys.stderr)  # fmt: skip
        if contribution:
            with atomic_write(out_dir / "layer_contribution.md", "w") as f:
                f.write(contribution_markdown(contribution))
            write_csv_atomic(out_dir / "layer_contribution.csv", contribution)
            plots.plot_layer_contribution(contribution, out_dir)
            written += ["layer_contribution.md", "layer_contribution.csv", "layer_contribution.png"]
    return written


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
    parser.add_argument("--depths", nargs="+", type=int, default=None,
                        help="numbers of blocks (--model.arch.n_layer): each recipe at each depth is its own "
                             "tuned comparison; a recipe's own depth keeps its run directories")  # fmt: skip
    parser.add_argument("--lrs-at", nargs="+", default=[], metavar="DEPTH=LR,LR,...",
                        help="the LR grid at one depth in place of --lrs, e.g. 48=2.5e-4,5e-4,1e-3 "
                             "(with --depths)")  # fmt: skip
    parser.add_argument("--contribution-tokens", type=int, default=DEFAULT_TOKENS,
                        help="validation tokens on which the layer contribution is measured at the picks (with "
                             f"--depths; default {DEFAULT_TOKENS}; 0: not measured)")  # fmt: skip
    parser.add_argument("--eval-precision", default=RUN, choices=PRECISIONS, metavar="PRECISION",
                        help="run (default): evaluate each run at the precision it trained with; 32-true: fp32; "
                             "auto: this machine's fastest; or any Lightning precision")  # fmt: skip
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
    check_depth_args(parser, args)
    return args


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
    try:
        selections, runs = run_sweep(args, profile, trainer)
    except (CheckpointError, PrecisionError) as err:  # a checkpoint corrupt, foreign, unsafe or on changed data
        print(f"resnorm-lm compare: error: {err}", file=sys.stderr)
        return 2
    if not runs:
        print("resnorm-lm compare: no finished runs to compare", file=sys.stderr)
        return 1
    unigram = unigram_reference(next(iter(runs.values())))
    rank = depth_sort_key if args.depths else sort_key
    try:
        table = sorted((recipe_row(sel, runs, unigram, len(args.seeds), args.eval_precision)
                        for sel in selections.values()), key=rank)  # fmt: skip
    except (CheckpointError, PrecisionError) as err:
        print(f"resnorm-lm compare: error: {err}", file=sys.stderr)
        return 2
    grid = grid_rows(selections, unigram, runs)
    out_dir = Path(args.results) / profile
    out_dir.mkdir(parents=True, exist_ok=True)
    command, hardware = command_line(args, profile), hardware_of(list(runs.values()))
    report = markdown_report(table, grid, profile, command, unigram, hardware, bool(args.depths))
    with atomic_write(out_dir / "compare.md", "w") as f:
        f.write(report)
    write_csv_atomic(out_dir / "compare.csv", table)
    write_csv_atomic(out_dir / "grid.csv", grid)
    own_depths = {r: recipe_depth(r, profile) for r in args.recipes}
    write_tuned_overlays(table, grid, out_dir / "tuned", profile, command, hardware, own_depths)
    from resnorm_lm.analysis.plots import (
        plot_clipping,
        plot_grad_norms,
        plot_loss_curves,
        plot_lr_sensitivity,
        plot_stream_rms,  # fmt: skip
    )

    depths = bool(args.depths)
    at_chosen = {arm_label(sel, depths): [d for _, d in chosen_runs(sel, runs)] for sel in selections.values()}
    at_chosen = {label: dirs for label, dirs in at_chosen.items() if dirs}
    if args.lrs or args.lrs_at:  # with depths, a line per (recipe, depth)
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
    if args.depths:
        written = write_depth_results(selections, runs, table, grid, unigram, out_dir, command,
                                      args.contribution_tokens)  # fmt: skip
        print(f"compare: the depth axis: wrote {', '.join(written)}")
    print("\n" + report)
    print(f"compare: wrote {out_dir}/compare.md, compare.csv, grid.csv, plots and tuned/<recipe>.yaml (copy one "
          f"into recipes/tuned/{profile}/ to make it the default) in {time.time() - started:.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

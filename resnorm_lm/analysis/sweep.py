"""Learning-rate and warmup sweeps, and what compare makes of them: the grid, the selection rule, the not-learning flag,
the rounds of a sweep, the evaluations its runs need, the table rows, and the tuned overlays.

A comparison is fair only when every configuration had the same chance, so ``compare`` trains each recipe over a
grid of peak learning rates and warmups, picks each recipe's setting by its mean validation loss over the seeds run
at it, and reports the test split only at the setting it picked. With a depth axis, each (recipe, depth) is an
``Arm``: its own grid, selection and seeds, as if it were a recipe of its own. ``launchers.py`` trains the runs."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resnorm_lm.analysis.evidence import num
from resnorm_lm.analysis.trained_run import RUN, eval_precision, evaluate_paths
from resnorm_lm.data.cache import atomic_write
from resnorm_lm.train.precision import uses_cuda
from resnorm_lm.train.recipes import recipe_at_depth, recipe_depth, tuned_overlay
from resnorm_lm.train.runs import RunConfig, RunDir, run_directory

if TYPE_CHECKING:
    from resnorm_lm.analysis.launchers import SweepTrainer

NOT_LEARNING_NATS = 0.1  # a validation loss within this of the unigram reference (or above it) learned nothing


@dataclass(frozen=True, order=True)
class Setting:
    """A peak learning rate and a warmup as a fraction of the run; None keeps the recipe's own value."""

    lr: float | None = None
    warmup: float | None = None  # model.optim.warmup_fraction

    @property
    def tag(self) -> str:
        """The run-directory tag: '' for the recipe's own setting, else e.g. 'lr0.001-wf0.25'."""
        parts = ([f"lr{self.lr:g}"] if self.lr is not None else []) + (
            [f"wf{self.warmup:g}"] if self.warmup is not None else []
        )
        return "-".join(parts)

    def overrides(self) -> list[str]:
        """LightningCLI overrides that train at this setting."""
        out = [f"--model.optim.lr={self.lr:g}"] if self.lr is not None else []
        return out + ([f"--model.optim.warmup_fraction={self.warmup:g}"] if self.warmup is not None else [])

    def describe(self) -> str:
        lr = f"lr {self.lr:g}" if self.lr is not None else "recipe lr"
        return f"{lr}, warmup {format(self.warmup, 'g') if self.warmup is not None else 'of the recipe'}"


@dataclass(frozen=True)
class Arm:
    """One tuned comparison: a recipe at a depth, with its own grid, selection and seeds.

    ``depth`` overrides the recipe's number of blocks (``--model.arch.n_layer``); None keeps the recipe's
    own, and with it the run directories of a sweep without depths, so those runs are reused as they are.
    """

    recipe: str
    depth: int | None = None

    @property
    def tag(self) -> str:
        """The depth's part of the run-directory tag: '' for the recipe's own depth, else e.g. 'd48'."""
        return "" if self.depth is None else f"d{self.depth}"

    def overrides(self) -> list[str]:
        return [] if self.depth is None else [f"--model.arch.n_layer={self.depth}"]


@dataclass(frozen=True)
class RunSpec:
    """One training run of a sweep: recipe (at a depth) x setting x seed. Seed k sets the init and the data order;
    ``init_seed`` or ``data_seed`` fix one of them apart from it (a pilot that separates the two)."""

    recipe: str
    setting: Setting
    seed: int
    depth: int | None = None  # Arm.depth: None is the recipe's own
    init_seed: int | None = None  # model.init_seed
    data_seed: int | None = None  # data.seed

    @property
    def arm(self) -> Arm:
        return Arm(self.recipe, self.depth)

    @property
    def tag(self) -> str:
        """'d48-lr0.001-wf0.25', 'lr0.001-wf0.25', 'd48' or '' (the recipe as plain ``make train`` runs it)."""
        return "-".join(part for part in (self.arm.tag, self.setting.tag) if part)

    def overrides(self) -> list[str]:
        """LightningCLI overrides that train this run's depth, setting and any seed fixed apart from ``seed``."""
        seeds = [f"--model.init_seed={self.init_seed}"] if self.init_seed is not None else []
        seeds += [f"--data.seed={self.data_seed}"] if self.data_seed is not None else []
        return self.arm.overrides() + self.setting.overrides() + seeds

    def run_dir(self, root: str, profile: str) -> Path:
        run = RunConfig(recipe=self.recipe, profile=profile, root=root, tag=self.tag)
        return run_directory(run, self.seed, data_seed=self.data_seed, init_seed=self.init_seed)


def grid_settings(lrs: list[float] | None, warmups: list[float] | None) -> list[Setting]:
    """Every (lr, warmup fraction) pair of the grid; an empty axis keeps the recipe's own value."""
    return [Setting(lr, wu) for lr in (lrs or [None]) for wu in (warmups or [None])]


def expand_grid(
    recipes: list[str], settings: list[Setting], seeds: list[int], depth: int | None = None
) -> list[RunSpec]:
    return [RunSpec(r, s, seed, depth) for r in recipes for s in settings for seed in seeds]


@dataclass
class RunOutcome:
    """What a finished run scored on validation, and how it ended."""

    spec: RunSpec
    val_loss: float | None
    diverged: bool = False

    def not_learning(self, unigram: float | None) -> bool:
        """Stuck at (or above) the unigram reference: learned token frequencies and nothing else."""
        if unigram is None or self.diverged or self.val_loss is None:
            return False
        return self.val_loss > unigram - NOT_LEARNING_NATS


@dataclass
class SettingScore:
    """A recipe's runs at one setting, over seeds."""

    setting: Setting
    outcomes: list[RunOutcome] = field(default_factory=list)

    @property
    def n_diverged(self) -> int:
        return sum(o.diverged or o.val_loss is None or not math.isfinite(o.val_loss) for o in self.outcomes)

    @property
    def losses(self) -> list[float]:
        return [o.val_loss for o in self.outcomes if not o.diverged and o.val_loss is not None]

    @property
    def mean(self) -> float:
        """Mean validation loss over seeds; infinite when any seed diverged (a setting must train every time)."""
        if self.n_diverged or not self.losses:
            return math.inf
        return statistics.fmean(self.losses)

    @property
    def std(self) -> float:
        return statistics.stdev(self.losses) if len(self.losses) > 1 else 0.0


@dataclass
class Selection:
    """A recipe's chosen setting, the runner-up worth confirming, and whether the grid should be widened."""

    recipe: str
    chosen: SettingScore | None
    runner_up: SettingScore | None
    scores: list[SettingScore]
    lr_edge: str | None = None  # "lowest" or "highest": the chosen lr is at that edge of its warmup's lrs
    warmup_edge: str | None = None  # the same for the chosen warmup among the warmups run at the chosen lr
    depth: int | None = None  # Arm.depth: the n_layer override, None for the recipe's own
    n_layer: int | None = None  # the number of blocks the runs have (for the tables; None: not known)

    @property
    def arm(self) -> Arm:
        return Arm(self.recipe, self.depth)

    @property
    def confirm(self) -> list[Setting]:
        """Settings that get the full set of seeds: the chosen one, and the runner-up when it lies within
        the chosen one's seed spread (one seed could not tell them apart)."""
        out = [self.chosen.setting] if self.chosen else []
        if self.chosen and self.runner_up and math.isfinite(self.runner_up.mean):
            spread = max(self.chosen.std, self.runner_up.std)
            if self.runner_up.mean - self.chosen.mean <= spread:
                out.append(self.runner_up.setting)
        return out


def grid_edge(value: float | None, values: list[float | None]) -> str | None:
    """The edge ("lowest" or "highest") when ``value`` is at that end of several ``values`` (None: the recipe's own)."""
    known = sorted({v for v in values if v is not None})
    if value is None or len(known) < 2:
        return None
    return "lowest" if value == known[0] else "highest" if value == known[-1] else None


def select(recipe: str, outcomes: list[RunOutcome], depth: int | None = None, n_layer: int | None = None) -> Selection:
    """The setting with the lowest mean validation loss over its seeds (test is never looked at).

    ``outcomes`` are one arm's (the recipe at ``depth``): each depth is chosen on its own runs."""
    by_setting: dict[Setting, SettingScore] = {}
    for outcome in outcomes:
        by_setting.setdefault(outcome.spec.setting, SettingScore(outcome.spec.setting)).outcomes.append(outcome)
    scores = sorted(by_setting.values(), key=lambda s: (s.mean, -len(s.losses), s.setting.lr or 0))
    chosen = scores[0] if scores and math.isfinite(scores[0].mean) else None
    runner_up = scores[1] if len(scores) > 1 else None
    lr_edge = warmup_edge = None
    if chosen:  # each axis along the chosen setting's row of the grid: a 2-D grid need not be full
        at = chosen.setting
        lr_edge = grid_edge(at.lr, [s.setting.lr for s in scores if s.setting.warmup == at.warmup])
        warmup_edge = grid_edge(at.warmup, [s.setting.warmup for s in scores if s.setting.lr == at.lr])
    return Selection(recipe, chosen, runner_up, scores, lr_edge, warmup_edge, depth, n_layer)


def chosen_runs(sel: Selection, runs: dict[RunSpec, Path]) -> list[tuple[RunSpec, Path]]:
    """The finished runs (``runs``: spec -> run directory) of an arm at its chosen setting, by seed."""
    if sel.chosen is None:
        return []
    mine = [(s, d) for s, d in runs.items() if s.arm == sel.arm and s.setting == sel.chosen.setting]
    return sorted(mine, key=lambda pair: pair[0].seed)


def estimate_seconds(step_seconds: list[float | None], max_steps: int, jobs: int) -> float | None:
    """Wall time of training one run of ``max_steps`` steps at each of ``step_seconds`` (seconds per step),
    ``jobs`` at a time: the slowest first, each round of ``jobs`` as long as its slowest run."""
    if any(s is None for s in step_seconds):
        return None
    ordered = sorted(step_seconds, reverse=True)
    return max_steps * sum(ordered[:: max(jobs, 1)])


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation bookkeeping for compare: which numbers a run's eval.json holds and whether they count, measuring
# those missing (validation on every finished run, test at the picks only), each run's validation outcome, and
# the unigram reference of the data the runs trained on.
#
# Everything is measured here, before any table is built: the tables (``tables.py``) only read eval.json.


def evaluated(run_dir: Path, split: str, precision: str = RUN) -> dict[str, Any] | None:
    """The split's numbers from eval.json when they were measured on the run's final weights, at the precision
    ``precision`` asks for (``eval_precision``). Numbers measured at another precision, or before eval.json
    recorded it, are measured again where the checkpoint is there; without it they are used as they are
    (the tables show their precision, or "not recorded")."""
    run = RunDir(run_dir)
    summary = run.summary()
    ev = summary.get("eval") or {}
    if ev.get("step") != summary.get("step") or split not in ev:
        return None
    wanted = eval_precision(precision, ev.get("trained_precision"), uses_cuda("auto")).precision
    if ev.get("precision") == wanted or not run.has_checkpoint():
        return ev[split]
    return None


def eval_precisions(run_dirs: list[Path]) -> str | None:
    """The precisions the runs' recorded evaluations ran at, for the tables."""
    found = {ev.get("precision") or "not recorded" for d in run_dirs if (ev := RunDir(d).summary().get("eval"))}
    return ", ".join(sorted(found)) or None


def ensure_evaluated(run_dirs: list[Path], split: str, precision: str = RUN) -> None:
    """Evaluate (every token of ``split`` once) the runs not yet evaluated at their last step and at ``precision``."""
    todo = [d for d in run_dirs if evaluated(d, split, precision) is None and not RunDir(d).summary().get("diverged")]
    gone = [str(d) for d in todo if not RunDir(d).has_checkpoint()]
    if gone:
        raise SystemExit(
            f"resnorm-lm compare: {len(gone)} finished run(s) need the {split} split evaluated but their "
            f"checkpoints are gone: {', '.join(gone[:3])}{' ...' if len(gone) > 3 else ''}. Put "
            f"checkpoints/last.ckpt back, or delete the run directory to retrain it."
        )
    if todo:
        evaluate_paths([str(d) for d in todo], [split], precision=precision, progress=False)


def ensure_picks_tested(selections: Iterable[Selection], runs: dict[RunSpec, Path], precision: str = RUN) -> None:
    """The test split evaluated on every run at each pick (and on no other run: test never chooses)."""
    for sel in selections:
        ensure_evaluated([run_dir for _, run_dir in chosen_runs(sel, runs)], "test", precision)


def outcome(spec: RunSpec, run_dir: Path, precision: str = RUN) -> RunOutcome:
    summary = RunDir(run_dir).summary()
    val = evaluated(run_dir, "validation", precision)
    loss = val.get("loss") if val else None
    diverged = bool(summary.get("diverged")) or (loss is not None and not math.isfinite(loss))
    return RunOutcome(spec, None if diverged else loss, diverged)


def unigram_reference(run_dir: Path) -> float:
    """The unigram cross-entropy of the data the run trained on (its settings from the run's config.yaml)."""
    from resnorm_lm.data.datamodule import TextDataModule
    from resnorm_lm.data.unigram import unigram_cross_entropy

    data = RunDir(run_dir).config()["data"]
    dm = TextDataModule(**data)
    dm.setup()
    return unigram_cross_entropy(dm.prepared)


# ---------------------------------------------------------------------------------------------------------------------
# The rounds of a sweep: the grid with the grid seeds, then every seed at each (recipe, depth)'s chosen settings,
# until the choice is stable. Each round trains what is missing (``SweepTrainer``), evaluates validation on every
# finished run (``ensure_evaluated``) and chooses again (``sweep.select``).


def finished_dirs(specs: list[RunSpec], root: str, profile: str) -> dict[RunSpec, Path]:
    dirs = {s: s.run_dir(root, profile) for s in specs}
    return {s: d for s, d in dirs.items() if RunDir(d).state() == "finished"}


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
        selections = {
            arm: select(arm.recipe, [o for a, o in outcomes if a == arm], arm.depth, n_layer)
            for arm, n_layer in arms.items()
        }
        wanted = {
            RunSpec(arm.recipe, setting, seed, arm.depth)
            for arm, sel in selections.items()
            for setting in sel.confirm
            for seed in args.seeds
        }
        new = sorted(wanted - set(specs), key=lambda s: (s.recipe, arms[s.arm], s.setting, s.seed))
        if not new:
            break
        specs += new
    return selections, finished_dirs(everything, args.root, profile)


# ---------------------------------------------------------------------------------------------------------------------
# The comparison's tables as rows: one per (recipe, depth) at its pick (compare.csv) and one per setting of
# its grid (grid.csv), with the order they are ranked in.
#
# Building a row only reads: the runs' eval.json (``eval_records.evaluated``) and config. The evaluations a
# row needs (validation everywhere, test at the picks: ``eval_records.ensure_picks_tested``) are made before.

METRICS = ["loss", "ppl", "bpb"]


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None, None
    return statistics.fmean(finite), (statistics.stdev(finite) if len(finite) > 1 else 0.0)


def recipe_row(
    sel: Selection,
    runs: dict[RunSpec, Path],
    unigram: float | None,
    seeds_wanted: int | None = None,
    precision: str = RUN,
) -> dict[str, Any]:
    """One table row: the chosen setting, validation and test over its seeds, flags, and the recipe's cost (test
    as recorded: a pick whose test split was not evaluated has none).

    A pick with fewer finished seeds than ``seeds_wanted`` (runs not trained with --no-train, or failed) says
    so in its status: its mean is not comparable in weight with a full pick's."""
    mine = {s: d for s, d in runs.items() if s.arm == sel.arm}
    summaries = [RunDir(d).summary() for d in mine.values()]
    row: dict[str, Any] = {
        "recipe": sel.recipe,
        "n_layer": sel.n_layer,
        "n_runs": len(mine),
        "train_s": round(sum(s.get("wall_s") or 0 for s in summaries), 1),
        "unigram_loss": unigram,
    }
    if sel.chosen is None:
        n_div = sum(sc.n_diverged for sc in sel.scores)
        row["status"] = f"diverged at every setting ({n_div} runs)" if sel.scores else "missing"
        return row
    setting = sel.chosen.setting
    chosen = {s: d for s, d in mine.items() if s.setting == setting}
    row.update(
        lr=setting.lr, warmup=setting.warmup, lr_edge=sel.lr_edge, warmup_edge=sel.warmup_edge, n_seeds=len(chosen)
    )
    row["eval_precision"] = eval_precisions(list(chosen.values()))
    for split, prefix in (("validation", "val"), ("test", "test")):
        results = [evaluated(d, split, precision) or {} for d in chosen.values()]
        for metric in METRICS:
            row[f"{prefix}_{metric}_mean"], row[f"{prefix}_{metric}_std"] = mean_std([r.get(metric) for r in results])
    facts = [RunDir(d).summary() for d in chosen.values()]
    row["schedule"] = ", ".join(sorted({RunDir(d).optim().get("schedule", "cosine") for d in chosen.values()}))
    row["init"] = ", ".join(sorted({i for i in (RunDir(d).init() for d in chosen.values()) if i})) or None
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
            flags = [
                f"{what} {count}/{n}"
                for what, count in (("diverged", score.n_diverged), ("not learning", stuck))
                if count
            ]
            # the loss shown is over the seeds that did not diverge; such a setting is never chosen (score.mean)
            clips = [RunDir(runs[o.spec]).summary().get("clip") for o in score.outcomes if o.spec in runs]
            clipped = [c["clipped_fraction"] for c in clips if c]  # runs from before the record have none
            rows.append(
                {
                    "recipe": sel.recipe,
                    "n_layer": sel.n_layer,
                    "lr": score.setting.lr,
                    "warmup": score.setting.warmup,
                    "n_seeds": n,
                    "val_loss_mean": statistics.fmean(score.losses) if score.losses else None,
                    "val_loss_std": score.std if score.losses else None,
                    "n_diverged": score.n_diverged,
                    "status": ", ".join(flags) or "ok",
                    "clipped_mean": statistics.fmean(clipped) if clipped else None,
                    "eval_precision": eval_precisions([runs[o.spec] for o in score.outcomes if o.spec in runs]),
                    "chosen": sel.chosen is not None and score.setting == sel.chosen.setting,
                }
            )
    return rows


def sort_key(row: dict[str, Any]) -> tuple:
    trained = row.get("val_loss_mean") is not None
    return (not trained, row["status"] != "ok", row.get("val_loss_mean") or math.inf)


def depth_sort_key(row: dict[str, Any]) -> tuple:
    """With a depth axis: depth by depth, each ranked as without one."""
    return (row.get("n_layer") or 0, *sort_key(row))


# ---------------------------------------------------------------------------------------------------------------------
# Tuned overlays: ``<results>/<profile>/tuned/<recipe>.yaml``, each recipe's chosen peak LR and warmup with the
# evidence (the command, the machine, the grid's numbers) in its comments. Copied into ``recipes/tuned/<profile>/``,
# one becomes that recipe's default at that profile (``resnorm_lm.train.recipes``).


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


def write_tuned_overlays(
    table: list[dict],
    grid: list[dict],
    out_dir: Path,
    profile: str,
    command: str,
    hardware: str,
    own_depths: dict[str, int] | None = None,
) -> None:
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
                evidence.append(
                    f"lr {g['lr']:g}, warmup {warmup}, {g['n_seeds']} seed(s): "
                    f"{num(g['val_loss_mean'], g['val_loss_std'])} ({g['status']}){mark}"
                )
        if row.get("lr_edge"):
            evidence.append(f"the chosen lr is the {row['lr_edge']} of the grid: widen it on that side")
        if row.get("warmup_edge"):
            evidence.append(f"the chosen warmup is the {row['warmup_edge']} of the grid: widen it on that side")
        out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_write(out_dir / f"{names[i]}.yaml", "w") as f:
            warmup = None if row.get("warmup") is None else float(row["warmup"])
            f.write(tuned_overlay(names[i], profile, row["lr"], warmup, evidence, row.get("schedule")))

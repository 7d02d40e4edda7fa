"""The rounds of a sweep: the grid with the grid seeds, then every seed at each (recipe, depth)'s chosen settings,
until the choice is stable. Each round trains what is missing (``SweepTrainer``), evaluates validation on every
finished run (``eval_records``) and chooses again (``sweep.select``).
"""

from __future__ import annotations

from pathlib import Path

from resnorm_lm.analysis.eval_records import ensure_evaluated, outcome
from resnorm_lm.analysis.sweep import Arm, RunSpec, Selection, expand_grid, grid_settings
from resnorm_lm.analysis.sweep import select as select_setting
from resnorm_lm.analysis.sweep_runner import SweepTrainer
from resnorm_lm.train.recipes import recipe_depth
from resnorm_lm.train.runs import RunDir


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
            arm: select_setting(arm.recipe, [o for a, o in outcomes if a == arm], arm.depth, n_layer)
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

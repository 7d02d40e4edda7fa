"""The designs a suite can have (a suite file's ``design:``), one class each in ``SUITE_DESIGNS``: which runs it
trains, decided only from the runs already finished. ``suite.py`` reads the file and runs the plan."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from resnorm_lm.analysis.sweep import RunOutcome, RunSpec, Setting
from resnorm_lm.errors import ResnormError
from resnorm_lm.registry import Registry


class SuiteError(ResnormError, ValueError):
    """A suite file that is missing, malformed, or names something that does not exist."""


# ---------------------------------------------------------------------------------------------------------------------
# The designs a suite can have: which runs it trains, decided only from the runs already finished.
#
# A design's ``plan`` is a pure function of the suite file and the outcomes of finished runs: it lists every run
# the suite wants so far, in the order to train them, and adds a run only once what decides it has finished. The
# runner (``suite_runner.train_suite``) trains what the plan lists and is not finished, then asks again, so an
# interrupted suite picks up where it was and a finished run is never trained twice.
#
# ``tuned``: the budget algorithm, the same for every recipe (``budget:`` in the file):
#
# 1. the grid, every LR x every warmup fraction, at the selection seed;
# 2. while the best setting sits at the edge of the LRs run at its warmup, one more LR beyond that edge (the
#    grid's own factor), at most ``extensions`` times;
# 3. the pick (the best at the selection seed) with every fresh seed, the runner-up with ``runner_up_seeds``.
#
# The selection seed chooses and is never reported (no winner's curse): the table's numbers are the fresh seeds'.
# A run's score is its final validation loss; a diverged run scores infinity; the test split is never looked at. So
# every recipe gets at most ``len(lrs) * len(warmups) + extensions + len(seeds) + len(runner_up_seeds)`` runs, and
# spends fewer only when its pick lies inside the grid.
#
# ``seeds``: the seed pilot (``pilot:`` in the file): each recipe at one fixed setting, over seeds k where seed k
# sets both the init and the data order, seeds where only the init varies (the data order fixed at
# ``fixed_seed``) and seeds where only the data order varies (the init fixed at ``fixed_seed``).

SUITE_DESIGNS: Registry[type[Design]] = Registry("suite design")
TUNED_KEYS = ("lrs", "warmups", "selection_seed", "extensions", "seeds", "runner_up_seeds", "lr_tolerance")
PILOT_KEYS = ("settings", "seeds", "fixed_seed")


def score(outcome: RunOutcome | None) -> float:
    """What a run scores in a selection: its validation loss; infinity for a diverged run (or none)."""
    if outcome is None or outcome.diverged or outcome.val_loss is None or not math.isfinite(outcome.val_loss):
        return math.inf
    return outcome.val_loss


def _numbers(section: dict, key: str, where: str, kind=float, positive: bool = True) -> list:
    values = section.get(key)
    if not isinstance(values, list) or not values:
        raise ValueError(f"{where}.{key}: a non-empty list")
    try:
        values = [kind(v) for v in values]
    except (TypeError, ValueError):
        raise ValueError(f"{where}.{key}: numbers, got {section[key]!r}") from None
    if positive and not all(v > 0 for v in values):
        raise ValueError(f"{where}.{key}: every value must be > 0, got {section[key]!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{where}.{key}: a value is listed twice: {section[key]!r}")
    return values


def _grid_lrs(values, where: str) -> list[float]:
    """A grid's LRs, sorted: at least three, so that a pick can lie inside the grid."""
    section, key = where.rsplit(".", 1)
    lrs = sorted(_numbers({key: values}, key, section))
    if len(lrs) < 3:
        raise ValueError(f"{where}: at least three learning rates, so that a pick can lie inside the grid")
    return lrs


class Design:
    """A suite's design: ``check`` its section of the file, ``plan`` its runs."""

    section: str  # its section of the suite file
    keys: tuple[str, ...]  # the keys that section may have

    def __init__(self, suite) -> None:
        self.suite = suite

    def own_section(self) -> dict:
        """The design's section of the suite file, its keys checked."""
        found = self.suite.sections.get(self.section)
        if not isinstance(found, dict):
            raise ValueError(
                f"design {self.suite.design} needs a `{self.section}:` section with {', '.join(self.keys)}"
            )
        unknown = sorted(set(found) - set(self.keys))
        if unknown:
            raise ValueError(f"{self.section}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(self.keys)}")
        return found

    @classmethod
    def check(cls, suite) -> None:
        try:
            cls(suite)
        except ValueError as err:
            raise _suite_error(suite, str(err)) from None

    def plan(self, outcomes: dict[RunSpec, RunOutcome]) -> list[RunSpec]:
        raise NotImplementedError

    def tested(self, outcomes: dict[RunSpec, RunOutcome]) -> list[RunSpec]:
        """The runs whose test split the table reports, of the recipes whose such runs have all finished (the
        runner evaluates them then, while their checkpoints are there); none by default."""
        return []


def _suite_error(suite, message: str) -> ValueError:
    return SuiteError(f"{suite.path}: {message}")


@dataclass
class Selection:
    """One recipe's tuning so far: the settings run at the selection seed, the pick and the runner-up."""

    recipe: str
    scores: dict[Setting, float] = field(default_factory=dict)  # every setting run at the selection seed
    extensions: list[Setting] = field(default_factory=list)
    pick: Setting | None = None
    runner_up: Setting | None = None
    lr_edge: str | None = None  # "lowest" or "highest": the pick is still at that edge after every extension
    complete: bool = False  # grid and extensions finished: the pick is final


@SUITE_DESIGNS.register("tuned")
class TunedBudget(Design):
    """The budget algorithm (see the module's docstring)."""

    section, keys = "budget", TUNED_KEYS

    def __init__(self, suite) -> None:
        super().__init__(suite)
        budget = self.own_section()
        self.lrs = self.grid_lrs(budget)
        self.warmups = sorted(_numbers(budget, "warmups", "budget", positive=False))
        if not all(0 <= w < 1 for w in self.warmups):
            raise ValueError(f"budget.warmups: fractions of the run in [0, 1), got {budget['warmups']!r}")
        self.selection_seed = int(budget.get("selection_seed", 0))
        self.extensions = int(budget.get("extensions", 2))
        self.seeds = _numbers(budget, "seeds", "budget", kind=int, positive=False)
        self.runner_up_seeds = _numbers(budget, "runner_up_seeds", "budget", kind=int, positive=False)
        if self.selection_seed in self.seeds or self.selection_seed in self.runner_up_seeds:
            raise ValueError(
                f"budget: the selection seed {self.selection_seed} must not be one of the fresh seeds: "
                "the seed that chooses a setting is never the one that reports it"
            )
        if not set(self.runner_up_seeds) <= set(self.seeds):
            raise ValueError("budget.runner_up_seeds: a subset of budget.seeds, so that pick and runner-up pair")
        if self.extensions < 0:
            raise ValueError(f"budget.extensions: a count >= 0, got {self.extensions}")
        self.lr_tolerance = float(budget.get("lr_tolerance", 0.05))

    def grid_lrs(self, budget: dict) -> list[float]:
        """The grid's LRs, one list for every recipe."""
        return _grid_lrs(budget.get("lrs"), "budget.lrs")

    def lrs_of(self, recipe: str) -> list[float]:
        return self.lrs

    @property
    def max_runs(self) -> int:
        """The most runs any recipe gets."""
        grid = len(self.lrs_of(self.suite.recipes[0])) * len(self.warmups)
        return grid + self.extensions + len(self.seeds) + len(self.runner_up_seeds)

    def grid(self, recipe: str) -> list[Setting]:
        return [Setting(lr, warmup) for warmup in self.warmups for lr in self.lrs_of(recipe)]

    def grid_text(self) -> str:
        """The grid's LRs as the table's protocol line says them."""
        return "LRs " + ", ".join(f"{lr:g}" for lr in self.lrs)

    def select(self, recipe: str, outcomes: dict[RunSpec, RunOutcome]) -> tuple[Selection, list[RunSpec]]:
        """The recipe's selection from the finished runs, and the selection-seed runs it wants so far."""
        sel = Selection(recipe)
        wanted = [RunSpec(recipe, s, self.selection_seed) for s in self.grid(recipe)]
        if any(spec not in outcomes for spec in wanted):
            sel.scores = {s.setting: score(outcomes[s]) for s in wanted if s in outcomes}  # the grid so far, drawn
            return sel, wanted
        run = {spec.setting: score(outcomes[spec]) for spec in wanted}
        while True:
            ranked = sorted(run, key=lambda s: (run[s], s.lr, s.warmup))
            best = ranked[0]
            row = sorted(s.lr for s in run if s.warmup == best.warmup)
            edge = "highest" if best.lr == row[-1] else "lowest" if best.lr == row[0] else None
            if math.isinf(run[best]):
                edge = None  # nothing trained anywhere: no direction to extend in
            if edge is None or len(sel.extensions) >= self.extensions:
                break
            beyond = row[-1] * row[-1] / row[-2] if edge == "highest" else row[0] * row[0] / row[1]
            extension = Setting(float(f"{beyond:.6g}"), best.warmup)
            sel.extensions.append(extension)
            spec = RunSpec(recipe, extension, self.selection_seed)
            wanted.append(spec)
            if spec not in outcomes:
                sel.scores = dict(run)
                return sel, wanted
            run[extension] = score(outcomes[spec])
        sel.scores, sel.lr_edge, sel.complete = run, edge, True
        sel.pick = best if math.isfinite(run[best]) else None
        finite = [s for s in ranked[1:] if math.isfinite(run[s])]
        sel.runner_up = finite[0] if sel.pick and finite else None
        return sel, wanted

    def tested(self, outcomes: dict[RunSpec, RunOutcome]) -> list[RunSpec]:
        """Each recipe's fresh seeds at its pick that have finished, each as soon as it has: the pick is final
        once the grid and extensions are in, and a checkpoint kept until its recipe's last seed ends can be lost
        with its machine. The test split chooses nothing, so nothing is decided earlier by looking at it."""
        found = []
        for recipe in self.suite.recipes:
            pick = self.select(recipe, outcomes)[0].pick
            if pick is not None:
                found += [spec for k in self.seeds if (spec := RunSpec(recipe, pick, k)) in outcomes]
        return found

    def plan(self, outcomes: dict[RunSpec, RunOutcome]) -> list[RunSpec]:
        wanted: list[RunSpec] = []
        for recipe in self.suite.recipes:
            sel, tuning = self.select(recipe, outcomes)
            wanted += tuning
            if sel.pick is not None:
                wanted += [RunSpec(recipe, sel.pick, k) for k in self.seeds]
                if sel.runner_up is not None:
                    wanted += [RunSpec(recipe, sel.runner_up, k) for k in self.runner_up_seeds]
        return wanted


@SUITE_DESIGNS.register("tuned-around")
class TunedAroundPicks(TunedBudget):
    """The budget algorithm on a grid of each recipe's own: ``budget.lrs`` maps every recipe to its LRs, all lists
    of one length and one spacing, so that every recipe has the same chance (e.g. a second horizon's grid narrowed
    to each recipe's pick at the first and its neighbours; the suite file states the rule it follows). Everything
    else is ``tuned``'s: warmups, extensions beyond an edge pick, seeds."""

    def grid_lrs(self, budget: dict) -> dict[str, list[float]]:
        given = budget.get("lrs")
        recipes = self.suite.recipes
        if not isinstance(given, dict) or sorted(given) != sorted(recipes):
            raise ValueError(
                f"budget.lrs: design tuned-around takes one list per recipe, a mapping with exactly "
                f"{', '.join(recipes)}, e.g. {recipes[0]}: [0.002, 0.004, 0.008]"
            )
        lrs = {recipe: _grid_lrs(given[recipe], f"budget.lrs.{recipe}") for recipe in recipes}
        ratios = {recipe: tuple(round(b / a, 6) for a, b in zip(v, v[1:])) for recipe, v in lrs.items()}
        if len(set(ratios.values())) > 1:
            raise ValueError(
                "budget.lrs: every recipe's grid must have the same length and spacing (the same chance for each), "
                "got " + "; ".join(f"{r}: {', '.join(f'{x:g}' for x in lrs[r])}" for r in recipes)
            )
        return lrs

    def lrs_of(self, recipe: str) -> list[float]:
        return self.lrs[recipe]

    def grid_text(self) -> str:
        return (
            "LRs per recipe ("
            + "; ".join(f"{recipe} {', '.join(f'{lr:g}' for lr in lrs)}" for recipe, lrs in self.lrs.items())
            + ")"
        )


@SUITE_DESIGNS.register("seeds")
class SeedPilot(Design):
    """The seed pilot (see the module's docstring): three groups of runs per recipe at its fixed setting."""

    section, keys = "pilot", PILOT_KEYS
    GROUPS = ("both", "init", "data")  # what varies with the seed: both, the init only, the data order only

    def __init__(self, suite) -> None:
        super().__init__(suite)
        pilot = self.own_section()
        settings = pilot.get("settings")
        if not isinstance(settings, dict) or set(settings) != set(suite.recipes):
            raise ValueError("pilot.settings: one `recipe: {lr: ..., warmup: ...}` for each of the suite's recipes")
        self.settings = {}
        for recipe, s in settings.items():
            if not isinstance(s, dict) or set(s) != {"lr", "warmup"}:
                raise ValueError(f"pilot.settings.{recipe}: {{lr: <peak LR>, warmup: <fraction of the run>}}")
            self.settings[recipe] = Setting(float(s["lr"]), float(s["warmup"]))
        self.seeds = _numbers(pilot, "seeds", "pilot", kind=int, positive=False)
        self.fixed_seed = int(pilot.get("fixed_seed", self.seeds[0]))
        if self.fixed_seed not in self.seeds:
            raise ValueError(f"pilot.fixed_seed {self.fixed_seed}: one of pilot.seeds, so that the groups share it")

    def cells(self, recipe: str) -> dict[str, list[RunSpec]]:
        """The runs of each group: seed k (both vary), the init varying at the fixed data order, and the data
        order varying at the fixed init; the fixed seed's own run is in every group."""
        setting, fixed = self.settings[recipe], self.fixed_seed
        own = RunSpec(recipe, setting, fixed)
        return {
            "both": [RunSpec(recipe, setting, k) for k in self.seeds],
            "init": [own, *(RunSpec(recipe, setting, k, data_seed=fixed) for k in self.seeds if k != fixed)],
            "data": [own, *(RunSpec(recipe, setting, k, init_seed=fixed) for k in self.seeds if k != fixed)],
        }

    @property
    def max_runs(self) -> int:
        return 3 * len(self.seeds) - 2

    def plan(self, outcomes: dict[RunSpec, RunOutcome]) -> list[RunSpec]:
        wanted: list[RunSpec] = []
        for group in self.GROUPS:  # group by group, each over every recipe: the paired comparison first
            for recipe in self.suite.recipes:
                wanted += [spec for spec in self.cells(recipe)[group] if spec not in wanted]
        return wanted

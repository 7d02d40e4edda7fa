"""Learning-rate and warmup sweeps: the grid, the selection rule, the not-learning flag, the cost estimate.

A comparison is fair only when every configuration had the same chance, so
``compare`` trains each recipe over a grid of peak learning rates and warmups,
picks each recipe's setting by its mean validation loss over the seeds run at
it, and reports the test split only at the setting it picked. ``sweep_rounds.py``
and ``sweep_runner.py`` train the runs, ``tables.py`` tabulates them; this module
only decides. With a depth axis, each (recipe, depth) is an ``Arm``: its own grid,
selection and seeds, as if it were a recipe of its own.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from resnorm_lm.train.runs import RunConfig, run_directory

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

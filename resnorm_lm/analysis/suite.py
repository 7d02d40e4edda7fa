"""``resnorm-lm suite`` / ``make suite SUITE=<name>``: train a pre-registered suite (``recipes/suites/<name>.yaml``,
read by ``load`` below) and render its tables.

    resnorm-lm suite placements-12l [--jobs 2] [--root runs/suites/placements-12l] [--no-train]
                                    [--train-args "--trainer.accelerator=gpu"]

It trains what the suite's design wants and is missing (``TunedBudget``, ``SeedPilot`` below), one run per core by
default (each run computes on one thread in the portable arithmetic), resumes runs that were interrupted and never
trains a finished run twice; stopped (Ctrl-C, SIGTERM), its runs save at the end of their step and the same command
goes on. Then it evaluates the test split where a table reports it, checks that the runs share one arithmetic
(``evidence.py``; ``--mix-provenance`` renders a mixed table with its rows marked), and writes
``results/suites/<name>/``: ``<name>.md`` (partial ones say so), CSVs and figures.

Here too: the suite file (``load``) and the designs (``TunedBudget``, ``SeedPilot``); the training of their plan
is ``suite_runner.py``'s, the tables and figures ``suite_report.py``'s, a second horizon's report ``horizons.py``'s
and the reference at a design's compute ``equal_compute.py``'s."""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resnorm_lm.analysis.drawn_recipes import DrawRule
from resnorm_lm.analysis.equal_compute import compute_mismatch, compute_target, steps_mismatch, write_equal_compute
from resnorm_lm.analysis.evidence import ProvenanceError, table_provenance
from resnorm_lm.analysis.horizons import horizon_mismatch, read_table, write_horizons
from resnorm_lm.analysis.reuse import OtherArithmetic, machine_fingerprints, probe_device, reuse_runs
from resnorm_lm.analysis.suite_report import PilotReport, TunedReport, write_pilot, write_tuned
from resnorm_lm.analysis.suite_runner import SuiteTrainer, evaluate_test, settle, train_suite
from resnorm_lm.analysis.sweep import RunOutcome, RunSpec, Setting, unigram_reference
from resnorm_lm.errors import ResnormError
from resnorm_lm.registry import Registry
from resnorm_lm.train.arithmetic import PORTABLE_ENV
from resnorm_lm.train.recipes import RECIPES_DIR, RecipeError, available_profiles, recipe_path
from resnorm_lm.train.runs import copy_small_files


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="resnorm-lm suite", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("suite", help=f"a suite name ({', '.join(available_suites()) or 'none yet'}) or file")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="runs trained at once (default: one per core; each run computes on one thread)",
    )
    parser.add_argument("--root", default=None, help="where the runs live (default: runs/suites/<name>)")
    parser.add_argument("--results", default="results/suites", help="tables and figures go to <results>/<name>/")
    parser.add_argument("--no-train", action="store_true", help="render the tables from the runs that exist")
    parser.add_argument(
        "--export",
        metavar="DIR",
        help="copy each finished run's small files (config, manifest, eval.json, metrics.csv; never "
        "a checkpoint) to DIR/<recipe>/<run>/, for git; the tables render from there with "
        "--root DIR --no-train",
    )
    parser.add_argument(
        "--train-args",
        default="",
        metavar='"--KEY=VALUE ..."',
        help="fit overrides for this machine in every run (--trainer.accelerator=gpu, where the data is; one alone "
        "as --train-args=--KEY=VALUE); what the protocol fixes is refused. Runs of another arithmetic make a table "
        "of their own, in a --root of their own (docs/comparing.md)",
    )
    parser.add_argument(
        "--reuse",
        action="append",
        default=[],
        metavar="DIR",
        help="take the finished runs this suite wants from another suite's root (or run files) where their config "
        "and arithmetic fingerprint are this suite's here, instead of training them (analysis/reuse.py); repeatable",
    )
    parser.add_argument(
        "--new-arithmetic",
        action="store_true",
        help="train here though the runs --reuse offers are of another machine arithmetic and none of the suite's "
        "is this machine's (refused otherwise: the suite would start again as a table of this machine's own)",
    )
    parser.add_argument(
        "--mix-provenance",
        action="store_true",
        help="render runs of different arithmetic in one table, each row marked (refused otherwise)",
    )
    parser.add_argument(
        "--logger",
        choices=["csv", "wandb"],
        default="csv",
        help="where the runs log besides metrics.csv: wandb adds a Weights & Biases run each, grouped "
        "'suite-<name>' (pip install -e '.[wandb]'; WANDB_MODE=offline works without a network)",
    )
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if any(not Path(d).is_dir() for d in args.reuse):
        parser.error(f"--reuse: no such folder of runs: {', '.join(d for d in args.reuse if not Path(d).is_dir())}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        suite = load(args.suite)
        machine = machine_overrides(suite, args.train_args)
        problem = suite.compute_of and steps_mismatch(suite, load(suite.compute_of[0], suite.path.parent))
        if problem:
            raise SuiteError(problem)
    except SuiteError as err:
        print(f"resnorm-lm suite: error: {err}", file=sys.stderr)
        return 2
    design = SUITE_DESIGNS.get(suite.design)(suite)
    root = args.root or f"runs/suites/{suite.name}"
    jobs = args.jobs or max(1, os.cpu_count() or 1)
    started = time.time()
    if args.reuse:  # another suite's finished runs that this one wants, where they are this suite's here
        fit = functools.partial(SuiteTrainer(suite, root, 1, args.logger, machine).command, resume=False)
        device = probe_device(machine)  # the fingerprints to match: the GPU's for runs trained on it
        fingerprints = functools.partial(machine_fingerprints, suite, device=device)
        try:
            reuse_runs(
                suite,
                functools.partial(settle, design, root, suite.profile),
                root,
                args.reuse,
                fit,
                fingerprints,
                new_arithmetic=args.new_arithmetic or args.no_train,  # --no-train starts nothing again
            )
        except OtherArithmetic as err:
            print(f"resnorm-lm suite: error: {err}", file=sys.stderr)
            return 2
    failed = set() if args.no_train else train_suite(suite, design, root, jobs, args.logger, machine)
    plan, outcomes = settle(design, root, suite.profile)
    if not outcomes:
        hint = f"train them (make suite SUITE={suite.name}), or give --root where they are"
        print(f"resnorm-lm suite: no finished runs of {suite.name} under {root}: {hint}", file=sys.stderr)
        return 1
    partial = any(spec not in outcomes for spec in plan) or bool(failed)
    provenance = table_provenance((spec.recipe, spec.run_dir(root, suite.profile)) for spec in outcomes)
    try:
        provenance.check(args.mix_provenance)
    except ProvenanceError as err:
        print(f"resnorm-lm suite: error: {err}", file=sys.stderr)
        return 2
    unigram = unigram_reference(next(iter(outcomes)).run_dir(root, suite.profile))
    out_dir = Path(args.results) / suite.name
    if isinstance(design, TunedBudget):
        report = TunedReport(suite, design, outcomes, root, unigram)
        picks = [
            s.run_dir(root, suite.profile)
            for s in outcomes
            if s.seed in design.seeds and s.setting == report.selections[s.recipe].pick
        ]
        evaluate_test(suite, picks)
        rows = report.rows()
        written = write_tuned(report, rows, provenance, partial, out_dir)
        if suite.horizon_of is not None:
            steps = (load(suite.horizon_of, suite.path.parent).max_steps, suite.max_steps)
            written += write_horizons(suite.name, suite.horizon_of, suite.reference, steps, rows, Path(args.results))
        if suite.compute_of is not None:
            written += write_equal_compute(suite, load(suite.compute_of[0], suite.path.parent), Path(args.results))
        written += rewrite_dependents_of(suite, Path(args.results))
    else:
        assert isinstance(design, SeedPilot)
        written = write_pilot(PilotReport(suite, design, outcomes, unigram), provenance, partial, out_dir)
    print((out_dir / f"{suite.name}.md").read_text())
    if args.export:  # after the test evaluation: its numbers are in eval.json
        copied = copy_small_files([s.run_dir(root, suite.profile) for s in outcomes], Path(root), Path(args.export))
        print(f"suite {suite.name}: exported the small files of {copied} run(s) to {args.export}")
    state = "PARTIAL: " + f"{len(outcomes)} of the {len(plan)} runs wanted so far" if partial else "complete"
    if failed:
        state += f"; {len(failed)} run(s) failed (see their train.log): run the same command again to retry"
    print(f"suite {suite.name}: {state}; wrote {', '.join(str(p) for p in written)} in {time.time() - started:.0f} s")
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# A suite file: a pre-registered comparison, written before any of its runs (``recipes/suites/<name>.yaml``).
#
# The file names everything a result depends on, so that nothing is chosen after the runs are seen: the recipes and
# the reference they are compared with, the profile, what every run trains with (horizon, precision, clip,
# schedule: LightningCLI overrides), the arithmetic (``portable``: kernels capped so that CPU kinds can compute the
# same numbers; the runs' fingerprints show whether they do, and an Intel Xeon and an AMD EPYC do not) and the design:
#
# * ``tuned`` (``TunedBudget``): the same budget algorithm for every recipe, a fixed number of runs at
#   most, fresh seeds at each recipe's pick;
# * ``tuned-around`` (``TunedAroundPicks``): the same, on a grid of each recipe's own, every grid of one length and
#   spacing (a second horizon's grid narrowed to each recipe's pick at the first and its neighbours);
# * ``seeds`` (``SeedPilot``): fixed settings, seeds that vary the init, the data order or both, to
#   measure how much of the spread each source is and what pairing by seed buys.
#
# ``make suite SUITE=<name>`` (``suite.py``) trains what is missing and renders the tables.

SUITES_DIR = RECIPES_DIR / "suites"
ARITHMETICS = ("portable", "native")  # portable: arithmetic.PORTABLE_ENV for every run; native: this machine's own
KEYS = {
    "about": "one line: the question the suite answers",
    "design": "tuned (the budget algorithm), tuned-around (it, on each recipe's own grid) or seeds (the seed pilot)",
    "profile": "the profile every run trains at (recipes/profiles/)",
    "recipes": "the recipes compared, a list",
    "reference": "the recipe the others' paired differences are taken from",
    "train": "LightningCLI overrides every run trains with, as `key: value` (trainer.max_steps: 500, ...)",
    "arithmetic": "portable (the default) or native",
    "budget": "the tuned designs' grid, extensions and seeds",
    "pilot": "the seeds design's settings and seeds",
    "horizon_of": "a suite this one repeats at another trainer.max_steps, all else equal (a second horizon)",
    "compute_of": "{suite: <a suite>, recipe: <its design>}: its reference at that design's training FLOPs",
    "recipes_of": "{table: <a suite's table.csv>, best: N, with: [...]}: the recipes, drawn from a complete table",
}


class SuiteError(ResnormError, ValueError):
    """A suite file that is missing, malformed, or names something that does not exist."""


def rewrite_dependents_of(base: Suite, results: Path) -> list[Path]:
    """The tables that read ``base``'s rendered table, written again where they are rendered in ``results``: the
    equal-compute tables of suites whose ``compute_of`` names it and the horizons tables of suites whose
    ``horizon_of`` names it. A new run of ``base`` changes their provenance lines and their rows, so a table of
    ``base`` never stands beside a stale comparison with it."""
    import yaml

    written = []
    for name in available_suites(base.path.parent):
        if not (results / name / "table.csv").is_file():
            continue  # not rendered here: nothing to keep in step
        # only its two keys are read first: loading a file can need results not rendered yet (recipes_of)
        raw = yaml.safe_load(suite_path(name, base.path.parent).read_text())
        raw = raw if isinstance(raw, dict) else {}
        target = raw.get("compute_of")
        if isinstance(target, dict) and target.get("suite") == base.name:
            written += write_equal_compute(load(name, base.path.parent), base, results)
        if raw.get("horizon_of") == base.name:
            long = load(name, base.path.parent)
            rows = read_table(results / name / "table.csv").values()  # its own rows, as it rendered them
            steps = (base.max_steps, long.max_steps)
            written += write_horizons(name, base.name, long.reference, steps, list(rows), results)
    return written


def available_suites(root: Path = SUITES_DIR) -> list[str]:
    return sorted(p.stem for p in root.glob("*.yaml"))


def suite_path(name: str, root: Path = SUITES_DIR) -> Path:
    """``recipes/suites/<name>.yaml``, or a path to a suite file."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    path = root / f"{name}.yaml"
    if not path.is_file():
        raise SuiteError(f"unknown suite {name!r}; available suites: {', '.join(available_suites(root)) or 'none'}")
    return path


# what every run of a suite shares beyond its file's train: section (the runner sets the rest for each run)
PROTOCOL_KEYS = ("model", "data.seed", "seed_everything", "trainer.max_steps", "trainer.precision")
RUNNER_KEYS = ("config", "recipe", "profile", "tuned", "ckpt_path", "run.root", "run.tag", "run.group")


@dataclass
class Suite:
    """A suite file, read and checked (``load``)."""

    name: str
    path: Path
    about: str
    design: str
    profile: str
    recipes: list[str]
    reference: str
    train: dict[str, Any]
    arithmetic: str = "portable"
    sections: dict[str, Any] = field(default_factory=dict)  # the design's own section (budget: or pilot:)
    horizon_of: str | None = None  # the suite this one repeats at another horizon (horizons.py)
    compute_of: tuple[str, str] | None = None  # (suite, design): its reference at the design's FLOPs (equal_compute.py)
    drawn_by: DrawRule | None = None  # the rule its recipes were drawn by from another table (drawn_recipes.py)

    def train_args(self) -> list[str]:
        """The ``fit`` overrides of every run: the file's ``train`` section."""
        return [f"--{key}={format_value(value)}" for key, value in self.train.items()]

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with the suite's arithmetic: the portable one's variables set over it, or ``env`` as it is."""
        return {**env, **PORTABLE_ENV} if self.arithmetic == "portable" else dict(env)

    @property
    def max_steps(self) -> int | None:
        steps = self.train.get("trainer.max_steps")
        return int(steps) if steps is not None else None


def machine_overrides(suite: Suite, text: str) -> list[str]:
    """``--train-args``: ``fit`` overrides for this machine, refused where they would change the protocol (or
    the run the runner makes) without the suite file saying so; ``--trainer={...}`` counts as each of its keys."""
    args = text.split()
    for arg in (a for a in args if a.startswith("--")):
        key = arg[2:].split("=", 1)[0]
        fixed = (*suite.train, *PROTOCOL_KEYS, *RUNNER_KEYS)
        clash = next((k for k in fixed if f"{key}.".startswith(f"{k}.") or k.startswith(f"{key}.")), None)
        if clash in RUNNER_KEYS:
            raise SuiteError(f"--train-args {arg}: suite sets {clash} for each run itself: leave it out")
        if clash:
            where = f"{suite.path}'s train: section" if clash in suite.train else "every suite"
            raise SuiteError(
                f"--train-args {arg}: {clash} is the protocol's ({where} fixes it), not the machine's: leave it "
                "out (another protocol is a suite file of its own; --train-args: --trainer.accelerator=gpu, ...)"
            )
    return args


def format_value(value: Any) -> str:
    """A value as the command line takes it: YAML's flow style for lists and mappings."""
    if isinstance(value, (list, dict)):
        import yaml

        return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def load(name: str, root: Path = SUITES_DIR) -> Suite:
    """Read and check a suite file (``yaml.safe_load``: data, never code); every mistake said with what to write."""
    import yaml

    path = suite_path(name, root)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SuiteError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise SuiteError(f"{path}: a suite file is a mapping of {', '.join(KEYS)}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise SuiteError(
            f"{path}: unknown key(s) {', '.join(unknown)}; a suite file has: "
            + "; ".join(f"{k} ({what})" for k, what in KEYS.items())
        )
    for key in ("design", "profile", "reference", "train"):
        if key not in raw:
            raise SuiteError(f"{path}: `{key}` is missing: {KEYS[key]}")
    if ("recipes" in raw) == ("recipes_of" in raw):
        raise SuiteError(f"{path}: give `recipes` ({KEYS['recipes']}) or `recipes_of` ({KEYS['recipes_of']}), one")
    drawn_by = None
    if "recipes_of" in raw:  # the rule is the file's; the list, the rule's result on a complete table
        try:
            drawn_by = DrawRule.parse(raw["recipes_of"])
            raw = {**raw, "recipes": drawn_by.draw()}
        except ValueError as err:
            raise SuiteError(f"{path}: {err}") from None
    try:
        design = SUITE_DESIGNS.get(raw["design"])
    except ValueError as err:
        raise SuiteError(f"{path}: design: {err}") from None
    recipes = raw["recipes"]
    if not isinstance(recipes, list) or not recipes or not all(isinstance(r, str) for r in recipes):
        raise SuiteError(f"{path}: recipes: a list of recipe names, e.g. [prenorm-12l, postnorm-12l]")
    if len(set(recipes)) != len(recipes):
        raise SuiteError(f"{path}: recipes: {', '.join(r for r in recipes if recipes.count(r) > 1)} named twice")
    try:
        for recipe in recipes:
            recipe_path(recipe)
    except RecipeError as err:
        raise SuiteError(f"{path}: recipes: {err}") from None
    if raw["reference"] not in recipes:
        raise SuiteError(f"{path}: reference {raw['reference']!r} is not one of its recipes ({', '.join(recipes)})")
    if raw["profile"] not in available_profiles():
        raise SuiteError(f"{path}: unknown profile {raw['profile']!r}; available: {', '.join(available_profiles())}")
    train = raw["train"]
    if not isinstance(train, dict) or not all(isinstance(k, str) and "." in k for k in train):
        raise SuiteError(f"{path}: train: a mapping of LightningCLI keys to values, e.g. trainer.max_steps: 500")
    steered = [k for k in train if k in ("model.optim.lr", "model.optim.warmup_fraction", "seed_everything")]
    if steered:
        raise SuiteError(f"{path}: train: {', '.join(steered)} is set by the design for each run, not for all")
    arithmetic = raw.get("arithmetic", "portable")
    if arithmetic not in ARITHMETICS:
        raise SuiteError(f"{path}: arithmetic {arithmetic!r}: one of {', '.join(ARITHMETICS)}")
    reference = raw["reference"]
    ordered = [reference, *[r for r in recipes if r != reference]]  # the reference trains first: pairs need it
    suite = Suite(
        name=path.stem,
        path=path,
        about=str(raw.get("about") or ""),
        design=raw["design"],
        profile=raw["profile"],
        recipes=ordered,
        reference=reference,
        train=dict(train),
        arithmetic=arithmetic,
        sections={k: raw[k] for k in ("budget", "pilot") if k in raw},
        horizon_of=raw.get("horizon_of"),
        drawn_by=drawn_by,
    )
    design.check(suite)
    try:
        suite.compute_of = compute_target(raw["compute_of"]) if "compute_of" in raw else None
    except ValueError as err:
        raise SuiteError(f"{path}: {err}") from None
    bases = {  # a suite this one repeats with another trainer.max_steps: nothing else may differ
        "horizon_of": (suite.horizon_of, horizon_mismatch),
        "compute_of": (suite.compute_of and suite.compute_of[0], compute_mismatch),
    }
    for key, (base, mismatch) in bases.items():
        if base is None:
            continue
        if base == suite.name:
            raise SuiteError(f"{path}: {key}: a suite cannot name itself")
        problem = mismatch(suite, load(base, path.parent))
        if problem:
            raise SuiteError(f"{path}: {key} {base!r}: {problem}")
    return suite


# ---------------------------------------------------------------------------------------------------------------------
# The designs a suite can have: which runs it trains, decided only from the runs already finished.
#
# A design's ``plan`` is a pure function of the suite file and the outcomes of finished runs: it lists every run
# the suite wants so far, in the order to train them, and adds a run only once what decides it has finished. The
# runner (``train_suite`` below) trains what the plan lists and is not finished, then asks again, so an interrupted
# suite picks up where it was and a finished run is never trained twice.
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
        return _grid_lrs(budget["lrs"] if "lrs" in budget else None, "budget.lrs")

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
        """Each recipe's fresh seeds at its pick, once every one of them has finished."""
        found = []
        for recipe in self.suite.recipes:
            pick = self.select(recipe, outcomes)[0].pick
            seeds = [RunSpec(recipe, pick, k) for k in self.seeds] if pick is not None else []
            if seeds and all(spec in outcomes for spec in seeds):
                found += seeds
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


if __name__ == "__main__":
    sys.exit(main())

"""``resnorm-lm suite`` / ``make suite SUITE=<name>``: train a pre-registered suite (``recipes/suites/<name>.yaml``,
read by ``load`` below) and render its tables.

    resnorm-lm suite placements-12l [--jobs 2] [--root runs/suites/placements-12l] [--no-train]
                                    [--train-args "--trainer.accelerator=gpu"]

It trains what the suite's design wants and is missing (``suite_designs.py``), one run per core by default (each
run computes on one thread in the portable arithmetic), resumes runs that were interrupted and never
trains a finished run twice; stopped (Ctrl-C, SIGTERM), its runs save at the end of their step and the same command
goes on. Then it evaluates the test split where a table reports it, checks that the runs share one arithmetic
(``evidence.py``; ``--mix-provenance`` renders a mixed table with its rows marked), and writes
``results/suites/<name>/``: ``<name>.md`` (partial ones say so), CSVs and figures.

Here too: the suite file (``load``); the designs are ``suite_designs.py``'s, the training of their plan
is ``suite_runner.py``'s, the tables and figures ``suite_report.py``'s, a second horizon's report ``horizons.py``'s
and the reference at a design's compute ``equal_compute.py``'s."""

from __future__ import annotations

import argparse
import functools
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
from resnorm_lm.analysis.suite_designs import (  # noqa: F401  (the designs, importable from here too)
    SUITE_DESIGNS,
    SeedPilot,
    SuiteError,
    TunedAroundPicks,
    TunedBudget,
)
from resnorm_lm.analysis.suite_report import PilotReport, TunedReport, write_pilot, write_tuned
from resnorm_lm.analysis.suite_runner import SuiteTrainer, evaluate_test, export_finished, settle, train_suite
from resnorm_lm.analysis.sweep import unigram_reference
from resnorm_lm.train.arithmetic import PORTABLE_ENV
from resnorm_lm.train.recipes import RECIPES_DIR, RecipeError, available_profiles, recipe_path


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
        "a checkpoint) to DIR/<recipe>/<run>/ as it finishes, for git; the tables render from there with "
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
    failed = set() if args.no_train else train_suite(suite, design, root, jobs, args.logger, machine, args.export)
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
        export_finished(suite, [s.run_dir(root, suite.profile) for s in outcomes], root, args.export)
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


if __name__ == "__main__":
    sys.exit(main())

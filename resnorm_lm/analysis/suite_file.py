"""A suite file: a pre-registered comparison, written before any of its runs (``recipes/suites/<name>.yaml``).

The file names everything a result depends on, so that nothing is chosen after the runs are seen: the recipes and
the reference they are compared with, the profile, what every run trains with (horizon, precision, clip,
schedule: LightningCLI overrides), the arithmetic (``portable``: the same numbers on every CPU kind, shown by the
runs' fingerprints) and the design:

* ``tuned`` (``suite_designs.TunedBudget``): the same budget algorithm for every recipe, a fixed number of runs at
  most, fresh seeds at each recipe's pick;
* ``seeds`` (``suite_designs.SeedPilot``): fixed settings, seeds that vary the init, the data order or both, to
  measure how much of the spread each source is and what pairing by seed buys.

``make suite SUITE=<name>`` (``suite.py``) trains what is missing and renders the tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resnorm_lm.errors import ResnormError
from resnorm_lm.train.recipes import RECIPES_DIR, RecipeError, available_profiles, recipe_path

SUITES_DIR = RECIPES_DIR / "suites"
ARITHMETICS = ("portable", "native")  # portable: arithmetic.PORTABLE_ENV for every run; native: this machine's own
KEYS = {
    "about": "one line: the question the suite answers",
    "design": "tuned (the budget algorithm) or seeds (the seed pilot)",
    "profile": "the profile every run trains at (recipes/profiles/)",
    "recipes": "the recipes compared, a list",
    "reference": "the recipe the others' paired differences are taken from",
    "train": "LightningCLI overrides every run trains with, as `key: value` (trainer.max_steps: 500, ...)",
    "arithmetic": "portable (the default) or native",
    "budget": "the tuned design's grid, extensions and seeds",
    "pilot": "the seeds design's settings and seeds",
}


class SuiteError(ResnormError, ValueError):
    """A suite file that is missing, malformed, or names something that does not exist."""


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

    def train_args(self) -> list[str]:
        """The ``fit`` overrides of every run: the file's ``train`` section."""
        return [f"--{key}={format_value(value)}" for key, value in self.train.items()]

    @property
    def max_steps(self) -> int | None:
        steps = self.train.get("trainer.max_steps")
        return int(steps) if steps is not None else None


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

    from resnorm_lm.analysis.suite_designs import SUITE_DESIGNS

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
    for key in ("design", "profile", "recipes", "reference", "train"):
        if key not in raw:
            raise SuiteError(f"{path}: `{key}` is missing: {KEYS[key]}")
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
    )
    design.check(suite)
    return suite

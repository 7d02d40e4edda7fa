"""Named recipes and profiles: YAML files under recipes/, resolved to LightningCLI ``--config`` arguments."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import torch

RECIPES_DIR = Path(os.environ.get("RESNORM_LM_RECIPES", Path(__file__).resolve().parents[2] / "recipes"))


class RecipeError(ValueError):
    """An unknown recipe or profile name."""


def available_recipes(root: Path = RECIPES_DIR) -> list[str]:
    return sorted(p.stem for p in root.glob("*.yaml"))


def available_profiles(root: Path = RECIPES_DIR) -> list[str]:
    return sorted(p.stem for p in (root / "profiles").glob("*.yaml"))


def recipe_path(name: str, root: Path = RECIPES_DIR) -> Path:
    path = root / f"{name}.yaml"
    if not path.is_file():
        raise RecipeError(f"unknown recipe {name!r}; available recipes: {', '.join(available_recipes(root))}")
    return path


def tuned_path(recipe: str, profile: str, root: Path = RECIPES_DIR) -> Path | None:
    """``recipes/tuned/<profile>/<recipe>.yaml``: the learning rate and warmup a sweep found best for this
    recipe at this profile's scale, applied on top of the recipe (a setting tuned at one scale does not
    carry to another, so it lives beside the profile, not in the recipe)."""
    path = root / "tuned" / profile / f"{recipe}.yaml"
    return path if path.is_file() else None


def tuned_overlay(recipe: str, profile: str, lr: float, warmup: int | None, evidence: list[str]) -> str:
    """The text of ``recipes/tuned/<profile>/<recipe>.yaml`` for a chosen ``lr`` and ``warmup`` (None: the
    recipe's own, as in a no-warmup ablation); ``evidence`` (the command, the hardware, the grid's numbers)
    goes into its comments, one line each."""
    lines = [f"# {recipe} at the {profile} profile: the peak LR and warmup chosen by a sweep (make compare)."]
    lines += [f"#   {line}" for line in evidence]
    lines += ["model:", "  optim:", f"    {'lr: ' + format(lr, 'g'):<22}# peak learning rate"]
    if warmup is not None:
        lines.append(f"    {'warmup_steps: ' + str(warmup):<22}# linear warmup steps")
    return "\n".join(lines) + "\n"


def recipe_depth(recipe: str, profile: str, root: Path = RECIPES_DIR) -> int:
    """The number of blocks ``fit --recipe <recipe> --profile <profile>`` builds: ``model.arch.n_layer`` of
    the tuned overlay, else of the recipe, else of the profile, else the model's default (the CLI's order)."""
    import yaml

    from resnorm_lm.model.gpt import GPTConfig

    depth = GPTConfig.n_layer
    for path in (root / "profiles" / f"{profile}.yaml", recipe_path(recipe, root), tuned_path(recipe, profile, root)):
        if path is not None:
            arch = ((yaml.safe_load(path.read_text()) or {}).get("model") or {}).get("arch") or {}
            depth = arch.get("n_layer", depth)
    return int(depth)


def recipe_at_depth(recipe: str, n_layer: int) -> str:
    """The name ``recipe`` has at ``n_layer`` blocks by the naming rule ``<placement>-<depth>l[-...]``
    (prenorm-12l at 24: prenorm-24l); a name without a depth part gets ``-d<n_layer>``."""
    name, found = re.subn(r"-\d+l(?=-|$)", f"-{n_layer}l", recipe, count=1)
    return name if found else f"{recipe}-d{n_layer}"


def resolve_profile(name: str, root: Path = RECIPES_DIR) -> str:
    """``auto`` picks ``gpu`` when CUDA is available and ``cpu`` otherwise, and says which."""
    if name == "auto":
        name = "gpu" if torch.cuda.is_available() else "cpu"
        reason = "a CUDA GPU is available" if name == "gpu" else "no CUDA GPU"
        print(f"resnorm-lm: PROFILE=auto picked '{name}' ({reason})", file=sys.stderr)
    if not (root / "profiles" / f"{name}.yaml").is_file():
        raise RecipeError(f"unknown profile {name!r}; available profiles: auto, {', '.join(available_profiles(root))}")
    return name


def _take_option(args: list[str], name: str) -> tuple[list[str], str | None]:
    """Remove ``--name X`` or ``--name=X`` from args; return the rest and X."""
    rest, value, i = [], None, 0
    while i < len(args):
        arg = args[i]
        if arg == f"--{name}":
            if i + 1 >= len(args):
                raise RecipeError(f"--{name} needs a value")
            value, i = args[i + 1], i + 2
            continue
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return rest, value


def expand_recipe_arguments(args: list[str], root: Path = RECIPES_DIR) -> list[str]:
    """Turn ``--recipe R --profile P`` into ``--config profiles/P.yaml --config R.yaml`` (and
    ``--config tuned/P/R.yaml`` where a sweep tuned R at P) plus run names.

    The configs go right after the subcommand, so later command-line overrides win.
    """
    args, recipe = _take_option(args, "recipe")
    args, profile = _take_option(args, "profile")
    if recipe is None and profile is None:
        return args
    profile = resolve_profile(profile or "auto", root)
    inserted = ["--config", str(root / "profiles" / f"{profile}.yaml"), f"--run.profile={profile}"]
    if recipe is not None:
        inserted += ["--config", str(recipe_path(recipe, root)), f"--run.recipe={recipe}"]
        tuned = tuned_path(recipe, profile, root)
        if tuned is not None:
            inserted += ["--config", str(tuned)]
    at = next((i + 1 for i, a in enumerate(args) if not a.startswith("-")), 0)  # after the subcommand
    return args[:at] + inserted + args[at:]

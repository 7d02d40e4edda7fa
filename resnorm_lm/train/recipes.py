"""Named recipes and profiles: YAML files under recipes/, resolved to LightningCLI ``--config`` arguments.

Where recipes/ is, first found: ``$RESNORM_LM_RECIPES``; the copy an installed wheel carries inside the package
(setup.py puts it there); the repository's own recipes/ (a checkout, an editable install).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import torch

from resnorm_lm.errors import ResnormError

PACKAGED_RECIPES = Path(__file__).resolve().parents[1] / "recipes"  # resnorm_lm/recipes/, in a wheel only
CHECKOUT_RECIPES = Path(__file__).resolve().parents[2] / "recipes"  # beside the package in the repository


def recipes_dir() -> Path:
    """The folder that holds the recipes, ``profiles/`` and ``tuned/``."""
    if os.environ.get("RESNORM_LM_RECIPES"):
        return Path(os.environ["RESNORM_LM_RECIPES"])
    return PACKAGED_RECIPES if PACKAGED_RECIPES.is_dir() else CHECKOUT_RECIPES


RECIPES_DIR = recipes_dir()


TUNED_KEYS = ("lr", "schedule", "warmup_fraction")  # what a tuned overlay sets under model.optim


class RecipeError(ResnormError, ValueError):
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


def recipe_base(recipe: str, root: Path = RECIPES_DIR) -> str | None:
    """The recipe that ``recipe`` varies (``run.base`` in its file: a norm or backend variant names the recipe it
    changes), or None."""
    import yaml

    run = (yaml.safe_load(recipe_path(recipe, root).read_text()) or {}).get("run") or {}
    base = run.get("base")
    if base is not None:
        recipe_path(base, root)  # an unknown base is an error in the recipe, said with the valid names
    return base


def recipe_optim(recipe: str, root: Path = RECIPES_DIR) -> dict:
    """What the recipe file itself sets under ``model.optim`` (a reference recipe's own LR and warmup)."""
    import yaml

    config = yaml.safe_load(recipe_path(recipe, root).read_text()) or {}
    return dict((config.get("model") or {}).get("optim") or {})


def tuned_setting(recipe: str, profile: str, root: Path = RECIPES_DIR) -> tuple[Path | None, str]:
    """The tuned overlay a run of ``recipe`` at ``profile`` gets, and a line that says which and from where: the
    recipe's own, else its base's (the same arithmetic but for what the variant changes), else none (the profile's
    untuned LR and warmup)."""
    own = tuned_path(recipe, profile, root)
    if own is not None:
        return own, f"tuned setting of {recipe} at the {profile} profile: {overlay_values(own)} ({shown(own, root)})"
    base = recipe_base(recipe, root)
    inherited = tuned_path(base, profile, root) if base is not None else None
    if inherited is not None:
        return inherited, (
            f"{recipe} has no tuned setting at the {profile} profile; it takes its base {base}'s: "
            f"{overlay_values(inherited)} ({shown(inherited, root)})"
        )
    nor = f" (nor has its base {base})" if base is not None else ""
    own_optim = {k: v for k, v in recipe_optim(recipe, root).items() if k in TUNED_KEYS}
    if own_optim:
        values = ", ".join(f"{k} {v}" for k, v in own_optim.items())
        return None, f"{recipe} has no tuned setting at the {profile} profile{nor}: it sets its own {values}"
    return None, (
        f"{recipe} has no tuned setting at the {profile} profile{nor}: its LR and warmup are the "
        f"profile's untuned defaults; `make compare` tunes them"
    )


def overlay_values(path: Path) -> str:
    import yaml

    optim = ((yaml.safe_load(path.read_text()) or {}).get("model") or {}).get("optim") or {}
    return ", ".join(
        f"{key} {optim[key]:g}" if not isinstance(optim[key], str) else f"{key} {optim[key]}"
        for key in TUNED_KEYS
        if key in optim
    )


def shown(path: Path, root: Path) -> str:
    """``path`` as ``recipes/...`` when it lies under the recipes folder."""
    return f"recipes/{path.relative_to(root)}" if path.is_relative_to(root) else str(path)


def tuned_overlay(
    recipe: str, profile: str, lr: float, warmup: float | None, evidence: list[str], schedule: str | None = None
) -> str:
    """The text of ``recipes/tuned/<profile>/<recipe>.yaml`` for a chosen ``lr`` and ``warmup`` fraction (None:
    the recipe's own, as in a no-warmup ablation); ``evidence`` (the command, the hardware, the grid's numbers)
    goes into its comments, one line each. ``schedule``: the schedule the sweep's runs trained with, stated so
    that the overlay means the same under a profile with another default."""
    lines = [f"# {recipe} at the {profile} profile: the peak LR and warmup chosen by a sweep (make compare)."]
    lines += [f"#   {line}" for line in evidence]
    lines += ["model:", "  optim:", f"    {'lr: ' + format(lr, 'g'):<22}# peak learning rate"]
    if schedule is not None:
        lines.append(f"    {'schedule: ' + schedule:<22}# resnorm_lm/train/optim.py")
    if warmup is not None:
        lines.append(f"    {'warmup_fraction: ' + format(warmup, 'g'):<22}# linear warmup, this fraction of the run")
    return "\n".join(lines) + "\n"


def recipe_depth(recipe: str, profile: str, root: Path = RECIPES_DIR) -> int:
    """The number of blocks ``fit --recipe <recipe> --profile <profile>`` builds: ``model.arch.n_layer`` of
    the tuned overlay, else of the recipe, else of the profile, else the model's default (the CLI's order)."""
    from resnorm_lm.model.gpt import GPTConfig

    return int(arch_settings(recipe, profile, root).get("n_layer", GPTConfig.n_layer))


def recipe_arch(recipe: str, profile: str, root: Path = RECIPES_DIR):
    """The ``GPTConfig`` that ``fit --recipe <recipe> --profile <profile>`` builds, with the data's vocabulary and
    context (for a model built without the data: benchmarks, recorded numbers)."""
    from resnorm_lm.model.gpt import GPTConfig

    return GPTConfig(**arch_settings(recipe, profile, root))


def arch_settings(recipe: str, profile: str, root: Path = RECIPES_DIR) -> dict:
    """``model.arch`` merged from the profile, the recipe and its tuned overlay (the CLI's order), with the data's
    ``vocab_size`` and ``block_size``."""
    import yaml

    merged: dict = {}
    tuned, _ = tuned_setting(recipe, profile, root)
    for path in (root / "profiles" / f"{profile}.yaml", recipe_path(recipe, root), tuned):
        if path is not None:
            config = yaml.safe_load(path.read_text()) or {}
            merged.update(((config.get("model") or {}).get("arch")) or {})
            data = config.get("data") or {}
            merged.update({k: data[k] for k in ("vocab_size", "block_size") if k in data})
    return merged


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


def expand_recipe_arguments(args: list[str], root: Path = RECIPES_DIR, say: bool = True) -> list[str]:
    """Turn ``--recipe R --profile P`` into ``--config profiles/P.yaml --config R.yaml`` (and
    ``--config tuned/P/R.yaml`` where a sweep tuned R at P, unless ``--tuned none``) plus run names.

    The configs go right after the subcommand, so later command-line overrides win. ``--tuned none`` leaves the
    tuned overlay out: a suite states every setting it tunes, and must not change when an overlay does.
    """
    args, recipe = _take_option(args, "recipe")
    args, profile = _take_option(args, "profile")
    args, tuned_choice = _take_option(args, "tuned")
    if tuned_choice not in (None, "auto", "none"):
        raise RecipeError(f"--tuned {tuned_choice}: auto (the tuned overlay where there is one) or none")
    if recipe is None and profile is None:
        if tuned_choice is not None:
            raise RecipeError("--tuned goes with --recipe")
        return args
    profile = resolve_profile(profile or "auto", root)
    inserted = ["--config", str(root / "profiles" / f"{profile}.yaml"), f"--run.profile={profile}"]
    if recipe is not None:
        inserted += ["--config", str(recipe_path(recipe, root)), f"--run.recipe={recipe}"]
        tuned, line = tuned_setting(recipe, profile, root)
        if tuned_choice == "none":
            tuned, line = None, f"{recipe} at the {profile} profile without its tuned overlay (--tuned none)"
        if tuned is not None:
            inserted += ["--config", str(tuned)]
        given = [name for name in TUNED_KEYS if any(a.startswith(f"--model.optim.{name}") for a in args)]
        if given:
            line += "; the command line sets " + " and ".join(f"model.optim.{name}" for name in given)
        if say:
            print(f"resnorm-lm: {line}", file=sys.stderr)
        inserted.append(f"--run.tuned_overlay={shown(tuned, root) if tuned is not None else 'none'}")
    at = next((i + 1 for i, a in enumerate(args) if not a.startswith("-")), 0)  # after the subcommand
    return args[:at] + inserted + args[at:]

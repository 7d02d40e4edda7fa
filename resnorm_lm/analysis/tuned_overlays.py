"""Tuned overlays: ``<results>/<profile>/tuned/<recipe>.yaml``, each recipe's chosen peak LR and warmup with the
evidence (the command, the machine, the grid's numbers) in its comments. Copied into ``recipes/tuned/<profile>/``,
one becomes that recipe's default at that profile (``resnorm_lm.train.recipes``).
"""

from __future__ import annotations

import time
from pathlib import Path

from resnorm_lm.analysis.report import num
from resnorm_lm.data.cache import atomic_write
from resnorm_lm.train.recipes import recipe_at_depth, tuned_overlay


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

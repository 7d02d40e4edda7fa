"""A suite's recipes drawn from another suite's finished table, by a rule its file writes down first.

    recipes_of: {table: docs/results/suites-h100/placements-12l/table.csv, best: 4, with: [prenorm-12l, postnorm-12l]}

reads as "the ``best`` recipes of that table by validation loss (the mean over its fresh seeds), and the ``with``
recipes": the wider model (placements-12l-w384) takes the four best placements and post-norm. The rule is what is
pre-registered, not a list picked after the rows were seen, so the list exists only once the table is complete:
before that, ``load`` refuses the suite and says how far the table is. A recipe whose every fresh seed failed, or
that diverged at every setting, has no validation loss and is not ranked. Ties in the mean keep the table's order.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from resnorm_lm.train.recipes import RECIPES_DIR

REPO_ROOT = RECIPES_DIR.parent  # a rule's table is named from the repository's root
FINAL = ("complete", "diverged at every setting")  # a row that no further run changes


@dataclass(frozen=True)
class DrawRule:
    table: Path  # a suite's table.csv, as `resnorm-lm suite` writes it
    best: int  # how many of its recipes, best validation loss first
    also: tuple[str, ...] = ()  # recipes taken whatever their rank (the file's `with:`)

    @classmethod
    def parse(cls, raw: object) -> DrawRule:
        """A suite file's ``recipes_of`` value, or a ValueError that shows the form."""
        form = "recipes_of: {table: <a suite's table.csv>, best: <how many>, with: [<recipes taken anyway>]}"
        if not isinstance(raw, dict) or not {"table", "best"} <= set(raw) or set(raw) - {"table", "best", "with"}:
            raise ValueError(f"{form}, got {raw!r}")
        best, also = raw["best"], raw.get("with", [])
        if not isinstance(best, int) or isinstance(best, bool) or best < 1:
            raise ValueError(f"recipes_of: best: a count of 1 or more, got {best!r}")
        if not isinstance(also, list) or not all(isinstance(r, str) for r in also):
            raise ValueError(f"recipes_of: with: a list of recipe names, got {also!r}")
        return cls(Path(str(raw["table"])), best, tuple(also))

    def path(self) -> Path:
        return self.table if self.table.is_absolute() else REPO_ROOT / self.table

    def draw(self) -> list[str]:
        """The recipes the rule gives from its table: the best first, then ``with``'s not already among them; a
        ValueError while the table is missing or not complete (how many of its rows are final, and which are not)."""
        path = self.path()
        if not path.is_file():
            raise ValueError(f"recipes_of: no table at {self.table}: render its suite first (resnorm-lm suite ...)")
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        waiting = [r["recipe"] for r in rows if r.get("status") not in FINAL]
        if not rows or waiting:
            raise ValueError(
                f"recipes_of: {self.table} is not complete ({len(rows) - len(waiting)} of {len(rows)} rows final; "
                f"waiting for {', '.join(waiting) or 'its rows'}): this suite's recipes are drawn from it once it is"
            )
        ranked = sorted((r for r in rows if loss(r) is not None), key=loss)
        if len(ranked) < self.best:
            raise ValueError(f"recipes_of: {self.table} ranks {len(ranked)} recipes, fewer than best: {self.best}")
        drawn = [r["recipe"] for r in ranked[: self.best]]
        return drawn + [r for r in self.also if r not in drawn]


def loss(row: dict[str, str]) -> float | None:
    """A table row's mean validation loss over its fresh seeds that learned (None: none did)."""
    try:
        value = float(row.get("val_loss_mean") or "nan")
    except ValueError:
        return None
    return value if math.isfinite(value) else None

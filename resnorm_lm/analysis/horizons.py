"""The same recipes at two horizons: a suite whose file says ``horizon_of: <suite>`` repeats that suite's protocol
with another ``trainer.max_steps`` (nothing else may differ: ``suite.load`` checks it). Beside its own table it
writes ``horizons.md``, ``horizons.csv`` and ``horizons.png``: each recipe's paired difference from the reference at
both horizons with its 95% interval, the verdict at each (ahead, behind, or a tie where the interval holds zero),
which verdicts change, and at the longer horizon the train-validation gap and the seeds whose validation turned up.

The shorter horizon's numbers are read from its rendered ``table.csv`` (``<results>/<suite>/``), so its runs need
not be on this machine; render it first (``make suite SUITE=<suite> ARGS=--no-train``).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resnorm_lm.analysis.evidence import Interval, interval_columns, interval_text
from resnorm_lm.analysis.plots import forest_plot
from resnorm_lm.data.cache import atomic_write, write_csv_atomic

if TYPE_CHECKING:
    from resnorm_lm.analysis.suite import Suite


def horizon_mismatch(suite: Suite, base: Suite) -> str | None:
    """What keeps ``suite`` from being a second horizon of ``base`` (None: nothing): the same design, profile,
    arithmetic, reference, budget and train overrides but trainer.max_steps, some or all of its recipes. One
    difference is allowed: a ``tuned-around`` suite may repeat a ``tuned`` one on a grid of each recipe's own (its
    ``budget.lrs``), the rest of the budget the same."""
    narrowed = (suite.design, base.design) == ("tuned-around", "tuned")  # each recipe's own budget.lrs
    compared = ("profile", "arithmetic", "reference", "sections")
    for what in compared if narrowed else ("design", *compared):
        mine, theirs = getattr(suite, what), getattr(base, what)
        if narrowed and what == "sections":
            mine, theirs = _without_lrs(mine), _without_lrs(theirs)
        if mine != theirs:
            return f"its {what} differs ({mine} against {theirs}); change max_steps only"
    extra = [r for r in suite.recipes if r not in base.recipes]
    if extra:
        return f"{', '.join(extra)} not in {base.name}; a second horizon takes some or all of its recipes"
    if {k: v for k, v in suite.train.items() if k != "trainer.max_steps"} != {
        k: v for k, v in base.train.items() if k != "trainer.max_steps"
    }:
        return f"train differs beyond trainer.max_steps; copy {base.name}'s train section, change max_steps only"
    if suite.max_steps is None or suite.max_steps == base.max_steps:
        return f"trainer.max_steps must differ from {base.name}'s ({base.max_steps})"
    return None


def _without_lrs(sections: dict[str, Any]) -> dict[str, Any]:
    """A suite's sections with the grid's LRs left out: ``tuned-around`` narrows only those."""
    return {**sections, "budget": {k: v for k, v in sections.get("budget", {}).items() if k != "lrs"}}


def interval_from(row: dict[str, Any], key: str) -> Interval | None:
    """``key``'s interval from a table.csv row (``<key>_mean``, ``_half_width``, ``_n``), None where empty."""
    mean = row.get(f"{key}_mean")
    if mean in (None, ""):
        return None
    half = row.get(f"{key}_half_width")
    return Interval(float(mean), None if half in (None, "") else float(half), int(float(row[f"{key}_n"])))


def read_table(path: Path) -> dict[str, dict[str, Any]]:
    """A rendered suite table (table.csv), by recipe."""
    with path.open(newline="") as f:
        return {row["recipe"]: row for row in csv.DictReader(f)}


def verdict(delta: Interval | None, reference: bool = False) -> str:
    """Lower loss is better: 'ahead' or 'behind' where the paired 95% interval excludes zero, else 'tie'; '-' where
    there is no interval yet (fewer than two paired seeds)."""
    if reference:
        return "reference"
    if delta is None or delta.half_width is None:
        return "-"
    if not delta.excludes_zero():
        return "tie"
    return "ahead" if delta.high < 0 else "behind"


def verdict_text(delta: Interval | None, said: str, digits: int = 3) -> str:
    """The verdict, and where the interval's end nearer zero rounds to zero at the table's ``digits`` decimals, how
    far from zero it ends: a separation the rounded numbers cannot show is said, not hidden in "-0.020 ± 0.020"."""
    if delta is None or delta.half_width is None or said not in ("ahead", "behind"):
        return said
    edge = delta.high if said == "ahead" else delta.low
    return f"{said}, at the edge (the interval ends at {edge:+.1e})" if abs(edge) < 0.5 * 10**-digits else said


def horizon_rows(reference: str, short: dict[str, dict], long: dict[str, dict]) -> list[dict[str, Any]]:
    """One row per recipe of the longer horizon's table (both tables as table.csv rows, by recipe)."""
    rows = []
    for recipe, row in sorted(long.items(), key=lambda item: item[0] != reference):  # the reference first
        before = short.get(recipe, {})
        is_ref = recipe == reference
        delta_short, delta_long = interval_from(before, "delta_val"), interval_from(row, "delta_val")
        verdicts = verdict(delta_short, is_ref), verdict(delta_long, is_ref)
        rows.append(
            {
                "recipe": recipe,
                "pick_short": pick(before),
                "val_short": interval_from(before, "val_loss"),
                "delta_short": delta_short,
                "verdict_short": verdicts[0],
                "pick_long": pick(row),
                "val_long": interval_from(row, "val_loss"),
                "delta_long": delta_long,
                "verdict_long": verdicts[1],
                "changed": "-" if "-" in verdicts or is_ref else ("yes" if verdicts[0] != verdicts[1] else "no"),
                "gap_long": interval_from(row, "gap"),
                "turned_up_long": turned_up(row),
            }
        )
    return rows


def pick(row: dict[str, Any]) -> str:
    return f"{float(row['lr']):g} / {float(row['warmup']):g}" if row.get("lr") not in (None, "", "-") else "-"


def turned_up(row: dict[str, Any]) -> str:
    k, n = row.get("val_turned_up_k"), row.get("val_turned_up_n")
    return "-" if k in (None, "") else f"{int(float(k))}/{int(float(n))}"


def provenance_of(markdown: Path) -> list[str]:
    """A rendered suite table's provenance lines (``- arithmetic ...``), as its ``<name>.md`` states them."""
    text = markdown.read_text().splitlines() if markdown.is_file() else []
    return [line[2:] for line in text if line.startswith("- arithmetic ")] or ["not stated (no rendered table)"]


def horizons_markdown(
    name: str, short_name: str, steps: tuple[int, int], rows: list[dict], partial: bool, provenance: dict
) -> str:
    short, long = steps
    lines = [
        f"# `{name}` beside `{short_name}`: {short} and {long} steps" + (" (PARTIAL)" if partial else ""),
        "",
        "Provenance of each horizon's table (a verdict is judged within one table; where the two tables' arithmetic "
        "differs, compare verdicts, not losses):",
        "",
        *[f"- {suite} ({steps_}): {line}" for (suite, steps_), found in provenance.items() for line in found],
        "",
        "Each recipe tuned at each horizon by the same budget algorithm (each table's protocol line gives its grid); "
        f"Δ val: paired by seed against the reference, mean ± 95% t interval over the fresh seeds (the two suites' "
        f"tables: `{short_name}.md`, `{name}.md`). A verdict "
        "is 'ahead' or 'behind' only where the interval excludes zero, else a tie (where the end nearer zero rounds "
        "to 0.000, the verdict says where it ends); 'changed' compares the verdicts. "
        f"At {long} steps: validation minus training loss, and the seeds whose validation was lower before the end.",
        "",
        f"| recipe | pick at {short} | val at {short} | Δ val at {short} | verdict | pick at {long} | val at {long} | "
        f"Δ val at {long} | verdict | changed | val - train at {long} | validation turned up |",
        "|---" * 12 + "|",
    ]
    for r in rows:
        cells = [
            f"`{r['recipe']}`",
            r["pick_short"],
            interval_text(r["val_short"]),
            interval_text(r["delta_short"], sign=True),
            verdict_text(r["delta_short"], r["verdict_short"]),
            r["pick_long"],
            interval_text(r["val_long"]),
            interval_text(r["delta_long"], sign=True),
            verdict_text(r["delta_long"], r["verdict_long"]),
            r["changed"],
            interval_text(r["gap_long"], sign=True),
            r["turned_up_long"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if partial:
        lines += ["", "PARTIAL: a row whose suite has not finished its seeds shows '-' or an interval that will move."]
    return "\n".join(lines) + "\n"


def plot_horizons(rows: list[dict], steps: tuple[int, int], out_dir: Path) -> Path | None:
    """Each recipe minus the reference at both horizons, with its 95% interval: a forest plot."""
    shown = [r for r in rows if r["delta_short"] is not None or r["delta_long"] is not None]
    if not shown:
        return None
    series = [("delta_short", f"{steps[0]} steps", "o"), ("delta_long", f"{steps[1]} steps", "s")]
    xlabel = "validation loss minus the reference's, paired by seed (nats; 95% interval)"
    return forest_plot(shown, series, xlabel, out_dir / "horizons.png")


def write_horizons(
    name: str, short_name: str, reference: str, steps: tuple[int, int], rows: list[dict], results: Path
) -> list[Path]:
    """horizons.md, horizons.csv and horizons.png beside the longer horizon's table (``rows``: its rows), or
    nothing where the shorter horizon's table has not been rendered (said on stdout)."""
    short_table = results / short_name / "table.csv"
    if not short_table.is_file():
        print(
            f"suite {name}: no {short_table} to set beside it: render it first "
            f"(make suite SUITE={short_name} ARGS=--no-train)"
        )
        return []
    short = read_table(short_table)
    long = {r["recipe"]: interval_columns(r) for r in rows}
    table = horizon_rows(reference, short, long)
    partial = any(r.get("status") != "complete" for r in (*long.values(), *short.values()))
    out_dir = results / name
    out_dir.mkdir(parents=True, exist_ok=True)
    provenance = {
        (short_name, f"{steps[0]} steps"): provenance_of(results / short_name / f"{short_name}.md"),
        (name, f"{steps[1]} steps"): provenance_of(out_dir / f"{name}.md"),
    }
    with atomic_write(out_dir / "horizons.md", "w") as f:
        f.write(horizons_markdown(name, short_name, steps, table, partial, provenance))
    write_csv_atomic(out_dir / "horizons.csv", [interval_columns(r) for r in table])
    written = [out_dir / "horizons.md", out_dir / "horizons.csv"]
    figure = plot_horizons(table, steps, out_dir)
    return written + ([figure] if figure else [])

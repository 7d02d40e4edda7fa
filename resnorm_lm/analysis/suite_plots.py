"""A suite's figures: each recipe's LR sensitivity in a panel of its own, with the pick's interval; the paired
differences from the reference as a forest plot; the seed pilot's spread by what varies."""

from __future__ import annotations

import math
from pathlib import Path

from resnorm_lm.analysis.plots import panels, plt, recipe_colors, save_figure
from resnorm_lm.analysis.suite_report import PilotReport, TunedReport


def plot_lr_panels(report: TunedReport, rows: list[dict], out_dir: Path) -> Path:
    """One panel per recipe: validation loss at the selection seed against the peak LR, a line per warmup; the
    pick's fresh-seed mean with its 95% interval; the unigram loss dashed."""
    recipes = report.suite.recipes
    fig, axes = panels(len(recipes), ncols=min(4, len(recipes)), width=3.2, height=2.6, sharey=True)
    by_recipe = {r["recipe"]: r for r in rows}
    top = report.unigram + 0.25
    finite = [v for sel in report.selections.values() for v in sel.scores.values() if math.isfinite(v)]
    bottom = min(finite, default=report.unigram - 1.5) - 0.1
    for ax, recipe in zip(axes, recipes):
        sel = report.selections[recipe]
        for warmup, style in zip(report.design.warmups, ("o-", "s--", "^:", "d-.")):
            points = sorted((s.lr, v) for s, v in sel.scores.items() if s.warmup == warmup)
            xs = [lr for lr, _ in points]
            ys = [min(v, top) if math.isfinite(v) else top for _, v in points]  # diverged: drawn at the top
            ax.plot(xs, ys, style, ms=3, lw=1, label=f"warmup {warmup:g}")
        row = by_recipe.get(recipe, {})
        if row.get("val_loss") is not None:
            ci = row["val_loss"]
            ax.errorbar(
                [row["lr"]],
                [ci.mean],
                yerr=[[ci.half_width or 0], [ci.half_width or 0]],
                fmt="*",
                color="black",
                ms=8,
                capsize=3,
                label=f"pick, {ci.n} fresh seeds",
            )
        ax.axhline(report.unigram, ls="--", lw=0.8, color="gray")
        ax.set_xscale("log")
        ax.set_ylim(bottom, top + 0.05)
        ax.set_title(recipe, fontsize=9)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("val loss (nats)")
    fig.suptitle("LR sensitivity: selection seed (lines), pick over fresh seeds (star, 95% interval)", fontsize=9)
    return save_figure(fig, axes, axes[:1], out_dir / "lr_panels.png")


def plot_paired_differences(report: TunedReport, rows: list[dict], out_dir: Path) -> Path | None:
    """Each recipe minus the reference, paired by seed, with its 95% interval: validation and test."""
    shown = [r for r in rows if r.get("delta_val") is not None]
    if not shown:
        return None
    colors = recipe_colors(report.suite.recipes)
    fig, ax = plt.subplots(figsize=(6.4, 0.45 * len(shown) + 1.4))
    for i, row in enumerate(reversed(shown)):
        for key, offset, marker in (("delta_val", 0.12, "o"), ("delta_test", -0.12, "s")):
            ci = row.get(key)
            if ci is None:
                continue
            ax.errorbar(
                [ci.mean],
                [i + offset],
                xerr=[[ci.half_width or 0], [ci.half_width or 0]],
                fmt=marker,
                color=colors[row["recipe"]],
                capsize=3,
                ms=4,
                label={"delta_val": "validation", "delta_test": "test"}[key] if i == 0 else None,
            )
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(shown)), [r["recipe"] for r in reversed(shown)], fontsize=8)
    ax.set_xlabel(f"loss minus {report.suite.reference}'s, paired by seed (nats; 95% interval)")
    return save_figure(fig, [ax], [ax], out_dir / "paired_differences.png")


def plot_seed_spread(report: PilotReport, out_dir: Path) -> Path:
    """Each recipe's final validation losses, one column per source of variation."""
    recipes = report.suite.recipes
    fig, axes = panels(len(recipes), ncols=len(recipes), width=3.4, height=3.0)
    names = {"both": "init + data", "init": "init only", "data": "data only"}
    for ax, recipe in zip(axes, recipes):
        for x, group in enumerate(report.design.GROUPS):
            values = list(report.values(recipe, group).values())
            ax.plot([x] * len(values), values, "o", ms=4, alpha=0.7)
        ax.set_xticks(range(3), [names[g] for g in report.design.GROUPS], fontsize=8)
        ax.set_title(recipe, fontsize=9)
        ax.set_ylabel("final val loss (nats)")
    return save_figure(fig, axes, [], out_dir / "seed_spread.png")

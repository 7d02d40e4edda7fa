"""Plots of a comparison: loss curves (against steps and wall time), per-layer gradient norms, LR
sensitivity, and along a depth axis: loss and chosen LR against depth, stability maps (LR x depth),
gradient norms and layer contribution per depth."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from resnorm_lm.analysis.block_measurements import block_means  # noqa: E402
from resnorm_lm.analysis.evidence import group_rows
from resnorm_lm.train.diagnostics import (  # noqa: E402
    ATTN_LOGIT_MAX,
    GRAD_NORMS,
    STREAM_RMS,
    TRAIN_LOSS,
    TRAIN_SECONDS,
    VAL_LOSS,
)
from resnorm_lm.train.runs import RunDir  # noqa: E402


def series(rows: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    points = sorted((r["step"], r[key]) for r in rows if key in r and "step" in r)
    return [p[0] for p in points], [p[1] for p in points]


def time_at(rows: list[dict[str, float]], steps: list[float]) -> list[float]:
    """Training wall time at each step, interpolated from the logged time/train_s."""
    known_steps, known_times = series(rows, TRAIN_SECONDS)
    if not known_steps:
        return []
    out = []
    for step in steps:
        i = next((j for j, s in enumerate(known_steps) if s >= step), len(known_steps) - 1)
        if i == 0 or known_steps[i] == step:
            out.append(known_times[i])
        else:
            s0, s1, t0, t1 = known_steps[i - 1], known_steps[i], known_times[i - 1], known_times[i]
            out.append(t0 + (t1 - t0) * (step - s0) / max(s1 - s0, 1e-9))
    return out


def save_figure(fig, axes, legend_axes, path: Path) -> Path:
    """Grid on every panel, legends where asked, then write the PNG and free the figure."""
    for ax in axes:
        ax.grid(alpha=0.3)
    for ax in legend_axes:
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def forest_plot(rows: list[dict], series: list[tuple[str, str, str]], xlabel: str, path: Path) -> Path:
    """A forest plot: one line per row (its ``recipe``, top to bottom in order), on it each of ``series``
    (key, label, marker) that the row has as a point with its 95% interval (an ``evidence.Interval``); zero marked.
    The first series is drawn filled, the others open, so that they read apart in grey too."""
    colors = recipe_colors([r["recipe"] for r in rows])
    fig, ax = plt.subplots(figsize=(6.4, 0.45 * len(rows) + 1.4))
    offsets = [0.12 - 0.24 * k / (len(series) - 1) if len(series) > 1 else 0.0 for k in range(len(series))]
    for key, label, marker in series:  # the legend in black: the colours are the recipes'
        ax.plot([], [], marker, color="black", mfc=None if key == series[0][0] else "white", ms=4, label=label)
    for i, row in enumerate(reversed(rows)):
        for (key, _, marker), offset in zip(series, offsets):
            ci = row.get(key)
            if ci is None or not math.isfinite(ci.mean):
                continue
            ax.errorbar(
                [ci.mean],
                [i + offset],
                xerr=[[ci.half_width or 0], [ci.half_width or 0]],
                fmt=marker,
                color=colors[row["recipe"]],
                mfc=None if key == series[0][0] else "white",
                capsize=3,
                ms=4,
            )
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)), [r["recipe"] for r in reversed(rows)], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)  # half a row's margin: the first and last rows' intervals clear of the frame
    ax.set_xlabel(xlabel)
    if len(series) > 1:  # above the panel, where it covers no interval
        ax.legend(fontsize=7, ncol=len(series), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    return save_figure(fig, [ax], [], path)


def recipe_colors(recipes) -> dict[str, tuple]:
    """One colour per recipe, the same in every figure: tab10 up to ten recipes (tab20's pairs look alike)."""
    names = sorted(set(recipes))
    palette = plt.cm.tab10 if len(names) <= 10 else plt.cm.tab20
    return {r: palette(i % palette.N) for i, r in enumerate(names)}


def plot_machine_pairs(pairs: list[dict], names: tuple[str, str], unigram: float, path: Path) -> Path:
    """The same runs on two machines: each run's validation loss on the first (x) against the second (y), a point
    per run coloured by its ``recipe``, the diagonal where they agree, and the unigram loss on both axes (a run
    near it did not learn). ``pairs``: dicts of recipe, first, second (None: diverged there, drawn at the top or
    right edge as an x)."""
    colors = recipe_colors([p["recipe"] for p in pairs])
    finite = [v for p in pairs for v in (p["first"], p["second"]) if v is not None]
    low, high = min(finite + [unigram]) - 0.05, max(finite + [unigram]) + 0.1
    fig, ax = plt.subplots(figsize=(7.4, 5.2))
    ax.plot([low, high], [low, high], color="black", lw=0.8, label="the same on both")
    ax.axvline(unigram, color="grey", ls=":", lw=0.8, label=f"unigram loss {unigram:.3f}")
    ax.axhline(unigram, color="grey", ls=":", lw=0.8)
    for recipe in sorted(colors):
        mine = [p for p in pairs if p["recipe"] == recipe]
        both = [p for p in mine if p["first"] is not None and p["second"] is not None]
        ax.plot(
            [p["first"] for p in both], [p["second"] for p in both], "o", ms=3.5, color=colors[recipe], label=recipe
        )
        edge = [
            (p["first"] if p["first"] is not None else high, p["second"] if p["second"] is not None else high)
            for p in mine
            if p["first"] is None or p["second"] is None
        ]
        if edge:
            ax.plot(*zip(*edge), "x", ms=5, color=colors[recipe])
    ax.set_xlim(low, high + 0.05)
    ax.set_ylim(low, high + 0.05)
    ax.set_xlabel(f"validation loss, {names[0]}")
    ax.set_ylabel(f"validation loss, {names[1]}")
    ax.set_title("the same runs on two machines (x at an edge: diverged there)", fontsize=9)
    # the legend beside the panel: inside it would hide the runs that learned on one machine only (the corners)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return save_figure(fig, [ax], [], path)


def plot_loss_curves(runs: dict[str, list[Path]], out_dir: Path) -> Path:
    """Training loss (thin) and validation loss (points) against steps and against training wall time."""
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=90)
    finite: list[float] = []
    colors = recipe_colors(runs)
    for recipe, run_dirs in sorted(runs.items()):
        color = colors[recipe]
        for j, run_dir in enumerate(run_dirs):
            rows = RunDir(run_dir).metrics()
            label = recipe if j == 0 else None
            for key, style in ((TRAIN_LOSS, dict(lw=0.8, alpha=0.6)), (VAL_LOSS, dict(marker="o", ms=4, lw=1.5))):
                steps, losses = series(rows, key)
                by_step.plot(steps, losses, color=color, label=label if key == VAL_LOSS else None, **style)
                times = time_at(rows, steps)
                if times:
                    by_time.plot(times, losses, color=color, **style)
                finite += [v for v in losses if v == v and abs(v) != float("inf")]
    if finite:  # a diverged run's spike would flatten everyone else's curve: clip the view, not the data
        finite.sort()
        top = finite[int(0.98 * (len(finite) - 1))]
        for ax in (by_step, by_time):
            ax.set_ylim(finite[0] - 0.2, top + 0.3)
    by_step.set(xlabel="optimizer step", ylabel="loss (nats/token)", title="train (line) and validation (dots) loss")
    by_time.set(xlabel="training wall time (s)", ylabel="loss (nats/token)", title="the same against wall time")
    return save_figure(fig, (by_step, by_time), (by_step,), out_dir / "loss_curves.png")


def plot_grad_norms(runs: dict[str, list[Path]], out_dir: Path) -> Path:
    """Per-layer gradient norms at step 0 (the initialization) and late in training, one run per recipe."""
    titles = ("per-layer gradient norm at step 0 (initialization)", "per-layer gradient norm late in training")
    return plot_first_and_last(runs, GRAD_NORMS, titles, "||grad W||", out_dir / "grad_norms.png")


def plot_stream_rms(runs: dict[str, list[Path]], out_dir: Path) -> Path | None:
    """The residual stream's RMS after each block, at step 0 and at the last logged step, one run per recipe
    (None where no run logged it: runs from before it was recorded)."""
    if not any(RunDir(run_dirs[0]).per_block(STREAM_RMS) for run_dirs in runs.values()):
        return None
    titles = ("residual stream RMS after each block, step 0", "the same at the last logged step")
    return plot_first_and_last(runs, STREAM_RMS, titles, "RMS", out_dir / "stream_rms.png")


def plot_attention_logits(runs: dict[str, list[Path]], out_dir: Path) -> Path | None:
    """Each run's largest attention logit over its blocks against the step, a colour per recipe and a line per
    run (None where no run logged it: runs from before it was recorded). Logits that grow as training goes are
    what Wortsman et al. (2023) saw precede divergence at high learning rates, and what QK-norm bounds."""
    logged = {
        recipe: [rows for d in dirs if (rows := RunDir(d).per_block(ATTN_LOGIT_MAX))] for recipe, dirs in runs.items()
    }
    logged = {recipe: traces for recipe, traces in logged.items() if traces}
    if not logged:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=90)
    colors = recipe_colors(logged)
    for recipe, traces in sorted(logged.items()):
        for j, rows in enumerate(traces):
            steps, largest = [s for s, _ in rows], [max(v) for _, v in rows]
            ax.plot(steps, largest, lw=1, alpha=0.8, color=colors[recipe], label=recipe if j == 0 else None)
    ax.set(
        xlabel="optimizer step",
        ylabel="largest |q.k|/sqrt(head_dim) over blocks",
        yscale="log",
        title="attention logits over training (a line per run)",
    )
    return save_figure(fig, [ax], [ax], out_dir / "attention_logits.png")


def plot_first_and_last(
    runs: dict[str, list[Path]], prefix: str, titles: tuple[str, str], ylabel: str, path: Path
) -> Path:
    """The per-block metric ``prefix`` of each recipe's first run: its first logged row left, its last right."""
    fig, (early, late) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=90, sharey=True)
    colors = recipe_colors(runs)
    for recipe, run_dirs in sorted(runs.items()):
        rows = RunDir(run_dirs[0]).per_block(prefix)
        if not rows:
            continue
        (_, first), (last_step, last) = rows[0], rows[-1]
        early.plot(first, marker="o", ms=3, color=colors[recipe], label=recipe)
        late.plot(last, marker="o", ms=3, color=colors[recipe], label=f"{recipe} (step {last_step})")
    early.set(title=titles[0], xlabel="block", ylabel=ylabel, yscale="log")
    late.set(title=titles[1], xlabel="block", yscale="log")
    return save_figure(fig, (early, late), (early, late), path)


def plot_lr_sensitivity(grid: list[dict], unigram: float | None, out_dir: Path) -> Path:
    """Final validation loss against peak LR (log axis), one small panel per recipe on a shared loss axis: a line
    per warmup, each point the mean over its seeds with their standard deviation as an error bar where it has
    several, the chosen setting a star, the unigram level dashed; the legend of the warmups once, below the panels.

    ``grid`` rows: recipe, lr, warmup, val_loss_mean (over the seeds that did not diverge; None where none
    did), val_loss_std, n_diverged, status, chosen. A setting where any seed diverged is drawn as a cross at the
    top of its panel, not dropped.
    """
    recipes = list(dict.fromkeys(g["recipe"] for g in grid))  # in the order compare lists them
    fig, axes = panels(len(recipes), ncols=min(5, len(recipes)), width=2.9, height=2.4, sharey=True, sharex=True)
    warmups = sorted({g["warmup"] for g in grid if g["warmup"] is not None})
    styles = dict(zip(warmups, ["o-", "s--", "^:", "d-."] * 4))
    finite = [g["val_loss_mean"] for g in grid if g["val_loss_mean"] is not None]
    top = max(finite + ([unigram] if unigram else [])) + 0.2 if finite else 1.0
    for ax, recipe in zip(axes, recipes):
        for warmup in sorted({g["warmup"] for g in grid if g["recipe"] == recipe}, key=lambda w: (w is None, w)):
            rows = sorted(
                (g for g in grid if g["recipe"] == recipe and g["warmup"] == warmup and g["lr"] is not None),
                key=lambda g: g["lr"],
            )
            ok = [g for g in rows if g["val_loss_mean"] is not None and not g.get("n_diverged")]
            style = styles.get(warmup, "o-")
            ax.errorbar(
                [g["lr"] for g in ok],
                [g["val_loss_mean"] for g in ok],
                yerr=[g.get("val_loss_std") or 0.0 for g in ok],
                fmt=style,
                ms=3,
                lw=1,
                capsize=2,
                color=f"C{warmups.index(warmup) % 10}" if warmup in warmups else "C0",
                label=f"warmup {warmup:g}" if len(warmups) > 1 else None,
            )
            chosen = [g for g in ok if g["chosen"]]
            ax.plot([g["lr"] for g in chosen], [g["val_loss_mean"] for g in chosen], "k*", ms=9, ls="none")
            bad = [g for g in rows if g not in ok]  # a seed diverged: the setting does not train every time
            ax.plot([g["lr"] for g in bad], [top] * len(bad), "rx", ms=6, ls="none")
        if unigram is not None:
            ax.axhline(unigram, color="gray", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(recipe, fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("final val loss (nats)", fontsize=8)
    fig.suptitle(
        "LR sensitivity: mean ± seed std; star: chosen; x: a seed diverged; dashed: unigram (not learning above)",
        fontsize=8,
    )
    for ax in axes:
        ax.grid(alpha=0.3)
    legend = {}  # every warmup once, from whichever panel has it
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    labels = sorted(legend, key=lambda text: float(text.split()[-1]))  # by warmup
    handles = [legend[label] for label in labels]
    if labels:
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.06 if labels else 0, 1, 0.95))
    path = out_dir / "lr_sensitivity.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_clipping(grid: list[dict], out_dir: Path) -> Path:
    """The fraction of optimizer steps whose gradient clip bound, against peak LR: a line per recipe and warmup
    (``grid`` rows with clipped_mean; rows without a record are left out)."""
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=90)
    colors = recipe_colors(g["recipe"] for g in grid)
    for recipe, color in colors.items():
        for warmup in sorted({g["warmup"] for g in grid if g["recipe"] == recipe}, key=lambda w: (w is None, w)):
            rows = sorted(
                (
                    g
                    for g in grid
                    if g["recipe"] == recipe
                    and g["warmup"] == warmup
                    and g["lr"] is not None
                    and g["clipped_mean"] is not None
                ),
                key=lambda g: g["lr"],
            )
            ax.plot(
                [g["lr"] for g in rows],
                [g["clipped_mean"] for g in rows],
                marker="o",
                ms=4,
                color=color,
                label=recipe if warmup is None else f"{recipe}, warmup {warmup}",
            )
    ax.set(
        xscale="log",
        ylim=(-0.03, 1.03),
        xlabel="peak learning rate",
        ylabel="fraction of steps clipped",
        title="How often the gradient clip bound (mean over seeds)",
    )
    return save_figure(fig, (ax,), (ax,), out_dir / "clipping.png")


# ---------------------------------------------------------------------- the depth axis


def depth_axis(ax, depths) -> None:
    """Depth on a log2 axis, ticked at the depths swept."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(depths))
    ax.set_xticklabels([str(d) for d in sorted(depths)])
    ax.minorticks_off()


def by_recipe(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows grouped by recipe, each group ordered by depth."""
    out: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: (r["recipe"], r.get("n_layer") or 0)):
        out.setdefault(row["recipe"], []).append(row)
    return out


def plot_depth_loss(table: list[dict], unigram: float | None, out_dir: Path) -> Path:
    """Validation loss at each (recipe, depth)'s chosen setting against depth: a line per recipe, the seed
    spread as error bars, hollow where the pick is not learning, a cross at the top where every setting
    diverged, the unigram level dashed."""
    fig, ax = plt.subplots(figsize=(8, 5), dpi=90)
    colors = recipe_colors(r["recipe"] for r in table)
    finite = [r["val_loss_mean"] for r in table if r.get("val_loss_mean") is not None]
    top = max(finite + ([unigram] if unigram else [])) + 0.2 if finite else 1.0
    for recipe, rows in by_recipe(table).items():
        ok = [r for r in rows if r.get("val_loss_mean") is not None]
        ax.errorbar(
            [r["n_layer"] for r in ok],
            [r["val_loss_mean"] for r in ok],
            yerr=[r.get("val_loss_std") or 0.0 for r in ok],
            color=colors[recipe],
            marker="o",
            ms=5,
            capsize=3,
            label=recipe,
        )
        stuck = [r for r in ok if r["status"].startswith("not learning")]
        ax.plot(
            [r["n_layer"] for r in stuck],
            [r["val_loss_mean"] for r in stuck],
            ls="none",
            marker="o",
            ms=9,
            mfc="white",
            mec=colors[recipe],
        )
        diverged = [r for r in rows if r.get("val_loss_mean") is None and r["status"].startswith("diverged")]
        ax.plot(
            [r["n_layer"] for r in diverged], [top] * len(diverged), ls="none", marker="x", ms=9, color=colors[recipe]
        )
    if unigram is not None:
        ax.axhline(unigram, color="gray", ls="--", lw=1)
        ax.text(
            0.01,
            unigram,
            "unigram (not learning above)",
            va="bottom",
            fontsize=7,
            color="gray",
            transform=ax.get_yaxis_transform(),
        )
    depth_axis(ax, {r["n_layer"] for r in table if r.get("n_layer")})
    ax.set(
        xlabel="blocks (n_layer)",
        ylabel="validation loss at the chosen LR (nats/token)",
        title="Best validation loss against depth\n(bars: seed std; hollow: not learning; x: every LR diverged)",
    )
    return save_figure(fig, (ax,), (ax,), out_dir / "depth_loss.png")


def plot_depth_lr(table: list[dict], out_dir: Path) -> Path:
    """The chosen peak LR against depth, a line per recipe; a triangle where the pick is at the grid's edge
    (up: highest, down: lowest), hollow where the pick is not learning."""
    fig, ax = plt.subplots(figsize=(8, 5), dpi=90)
    colors = recipe_colors(r["recipe"] for r in table)
    groups = by_recipe(table)
    for k, (recipe, rows) in enumerate(groups.items()):
        ok = [r for r in rows if r.get("lr") is not None]
        shift = 2 ** (0.03 * (k - (len(groups) - 1) / 2))  # picks share the grid's LRs: spread the lines apart
        ax.plot(
            [r["n_layer"] * shift for r in ok],
            [r["lr"] for r in ok],
            color=colors[recipe],
            marker="o",
            ms=5,
            label=recipe,
        )
        for r in ok:
            marker = {"highest": "^", "lowest": "v"}.get(r.get("lr_edge") or "", None)
            stuck = r["status"].startswith("not learning")
            if marker or stuck:
                ax.plot(
                    [r["n_layer"] * shift],
                    [r["lr"]],
                    ls="none",
                    marker=marker or "o",
                    ms=10,
                    color=colors[recipe],
                    mfc="white" if stuck else colors[recipe],
                )
    depth_axis(ax, {r["n_layer"] for r in table if r.get("n_layer")})
    ax.set(
        yscale="log",
        xlabel="blocks (n_layer)",
        ylabel="chosen peak learning rate",
        title="Chosen LR against depth (triangle: at the grid's edge; hollow: not learning;\n"
        "lines shifted sideways a little so that equal picks stay visible)",
    )
    return save_figure(fig, (ax,), (ax,), out_dir / "depth_lr.png")


def panels(n: int, ncols: int, width: float = 3.6, height: float = 3.0, **kwargs):
    """A figure with ``n`` panels in rows of ``ncols``; the unused ones hidden."""
    nrows = max(1, -(-n // ncols))
    ncols = min(ncols, max(n, 1))
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), dpi=90, squeeze=False, **kwargs)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def stability_cells(rows: list[dict]) -> tuple[list[float], list[int], dict[tuple[int, float], dict]]:
    """A recipe's grid rows as heatmap cells: its LRs, its depths, and per (depth, lr) the best warmup's
    row among those where no seed diverged, or the diverged row when every warmup had a divergence."""
    lrs = sorted({r["lr"] for r in rows if r["lr"] is not None})
    depths = sorted({r["n_layer"] for r in rows if r.get("n_layer")})
    cells: dict[tuple[int, float], dict] = {}
    for r in rows:
        key = (r.get("n_layer"), r["lr"])
        ok = r["val_loss_mean"] is not None and not r.get("n_diverged")
        best = cells.get(key)
        best_ok = best is not None and best["val_loss_mean"] is not None and not best.get("n_diverged")
        if best is None or (ok and (not best_ok or r["val_loss_mean"] < best["val_loss_mean"])):
            cells[key] = r
    return lrs, depths, cells


def plot_stability_maps(grid: list[dict], unigram: float | None, out_dir: Path) -> Path:
    """A heatmap per recipe, LR x depth, coloured by the validation loss (the best warmup where there are
    several): 'x' on grey where a seed diverged, 's' where the runs are not learning, a box at each depth's
    chosen LR, blank where nothing was run. One colour scale for every panel, topped at the unigram level."""
    groups = by_recipe([g for g in grid if g["lr"] is not None])
    finite = [g["val_loss_mean"] for g in grid if g["val_loss_mean"] is not None and not g.get("n_diverged")]
    vmin = min(finite) if finite else 0.0
    vmax = unigram if unigram is not None and finite and unigram > vmin else (max(finite) if finite else 1.0)
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")  # bad: not run
    fig, axes = panels(len(groups), ncols=min(5, max(len(groups), 1)), layout="constrained")
    image = None
    for ax, (recipe, rows) in zip(axes, groups.items()):
        lrs, depths, cells = stability_cells(rows)
        values = [[math.nan] * len(lrs) for _ in depths]  # (depths, lrs)
        for (depth, lr), r in cells.items():
            i, j = depths.index(depth), lrs.index(lr)
            if r.get("n_diverged"):
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, color="lightgray"))
                ax.text(j, i, "x", ha="center", va="center", fontsize=8)
            else:
                values[i][j] = r["val_loss_mean"]
                stuck = "\ns" if "not learning" in r["status"] else ""
                bright = (r["val_loss_mean"] - vmin) / max(vmax - vmin, 1e-9) > 0.6  # viridis' yellow end
                ax.text(
                    j,
                    i,
                    f"{r['val_loss_mean']:.2f}{stuck}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="black" if bright else "white",
                )
            if r.get("chosen"):
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=2))
        image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, origin="lower", aspect="auto")
        ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs], rotation=60, fontsize=6)
        ax.set_yticks(range(len(depths)), [str(d) for d in depths], fontsize=7)
        ax.set(xlabel="peak LR", ylabel="blocks", title=recipe)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="validation loss (nats/token)")
    fig.suptitle("Stability maps: LR x depth (x: a seed diverged; s: not learning; red box: chosen)", fontsize=10)
    fig.savefig(out_dir / "stability_map.png")
    plt.close(fig)
    return out_dir / "stability_map.png"


def plot_depth_grad_norms(runs: dict[tuple[str, int], Path], out_dir: Path) -> Path:
    """Per-layer gradient norms at each depth, from one run per (recipe, depth) at its chosen setting:
    metrics.csv's first logged row (step 0, the initialization, before any update) on top, its last row
    (late in training) below; a column per depth, a line per recipe."""
    return plot_depth_by_block(runs, GRAD_NORMS, "||grad W||", out_dir / "depth_grad_norms.png")


def plot_depth_stream_rms(runs: dict[tuple[str, int], Path], out_dir: Path) -> Path | None:
    """The residual stream's RMS after each block at each depth (LayerNorm Scaling's Fig. 1), laid out as
    ``plot_depth_grad_norms``; None where no run logged it."""
    if not any(RunDir(run_dir).per_block(STREAM_RMS) for run_dir in runs.values()):
        return None
    return plot_depth_by_block(runs, STREAM_RMS, "residual stream RMS", out_dir / "depth_stream_rms.png")


def plot_depth_by_block(runs: dict[tuple[str, int], Path], prefix: str, ylabel: str, path: Path) -> Path:
    """The per-block metric ``prefix`` of one run per (recipe, depth): step 0 on top, the last logged step
    below; a column per depth, a line per recipe, log scale."""
    depths = sorted({depth for _, depth in runs})
    fig, axes = plt.subplots(2, max(len(depths), 1), figsize=(4 * max(len(depths), 1), 7), dpi=90, squeeze=False)
    colors = recipe_colors(recipe for recipe, _ in runs)
    for (recipe, depth), run_dir in sorted(runs.items()):
        rows = RunDir(run_dir).per_block(prefix)
        if not rows:
            continue
        col = depths.index(depth)
        for ax, (_, values) in ((axes[0][col], rows[0]), (axes[1][col], rows[-1])):
            ax.plot(range(len(values)), values, marker="o", ms=2, color=colors[recipe], label=recipe)
    for col, depth in enumerate(depths):
        axes[0][col].set(title=f"{depth} blocks: step 0 (initialization)", yscale="log", ylabel=ylabel)
        axes[1][col].set(
            title=f"{depth} blocks: last logged step", yscale="log", xlabel="block (0: input side)", ylabel=ylabel
        )
    flat = list(axes.flat)
    for ax in flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return save_figure(fig, flat, flat[:1], path)


def plot_layer_contribution(rows: list[dict], out_dir: Path) -> Path:
    """Per block, mean over seeds: the validation-loss increase when the block is skipped (top, symlog) and
    the angular distance between its input and output (bottom); a column per depth, a line per recipe.

    ``rows``: recipe, n_layer, seed, layer (0-based), loss_increase, angular_distance."""
    depths = sorted({r["n_layer"] for r in rows})
    fig, axes = plt.subplots(2, max(len(depths), 1), figsize=(4 * max(len(depths), 1), 7), dpi=90, squeeze=False)
    colors = recipe_colors(r["recipe"] for r in rows)
    for (recipe, depth), mine in sorted(group_rows(rows, ("recipe", "n_layer")).items()):
        col = depths.index(depth)
        for ax, key in ((axes[0][col], "loss_increase"), (axes[1][col], "angular_distance")):
            layers, means = block_means(mine, key)
            ax.plot(layers, means, marker="o", ms=2, color=colors[recipe], label=recipe)
    for col, depth in enumerate(depths):
        axes[0][col].set(title=f"{depth} blocks: loss increase when skipped", ylabel="nats/token")
        axes[0][col].set_yscale("symlog", linthresh=1e-2)  # a first block costs nats, a deep one hundredths
        axes[1][col].set(
            title=f"{depth} blocks: angular distance in -> out", xlabel="block (0: input side)", ylim=(0, None)
        )
    flat = list(axes.flat)
    for ax in flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return save_figure(fig, flat, flat[:1], out_dir / "layer_contribution.png")

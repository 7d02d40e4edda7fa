"""Plots of a comparison: loss curves (against steps and wall time) and per-layer gradient norms."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """metrics.csv rows as {column: float}, empty cells dropped."""
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]


def series(rows: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    points = sorted((r["step"], r[key]) for r in rows if key in r and "step" in r)
    return [p[0] for p in points], [p[1] for p in points]


def time_at(rows: list[dict[str, float]], steps: list[float]) -> list[float]:
    """Training wall time at each step, interpolated from the logged time/train_s."""
    known_steps, known_times = series(rows, "time/train_s")
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


def recipe_colors(recipes) -> dict[str, tuple]:
    """One colour per recipe, the same in every figure: tab10 up to ten recipes (tab20's pairs look alike)."""
    names = sorted(set(recipes))
    palette = plt.cm.tab10 if len(names) <= 10 else plt.cm.tab20
    return {r: palette(i % palette.N) for i, r in enumerate(names)}


def plot_loss_curves(runs: dict[str, list[Path]], out_dir: Path) -> Path:
    """Training loss (thin) and validation loss (points) against steps and against training wall time."""
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=90)
    finite: list[float] = []
    colors = recipe_colors(runs)
    for recipe, run_dirs in sorted(runs.items()):
        color = colors[recipe]
        for j, run_dir in enumerate(run_dirs):
            rows = read_metrics(run_dir)
            label = recipe if j == 0 else None
            for key, style in (("train/loss", dict(lw=0.8, alpha=0.6)), ("val/loss", dict(marker="o", ms=4, lw=1.5))):
                steps, losses = series(rows, key)
                by_step.plot(steps, losses, color=color, label=label if key == "val/loss" else None, **style)
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


def layer_norms(row: dict[str, float]) -> list[float]:
    keys = sorted(k for k in row if k.startswith("grad_norm/layer_"))
    return [row[k] for k in keys]


def plot_grad_norms(runs: dict[str, list[Path]], out_dir: Path) -> Path:
    fig, (early, late) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=90, sharey=True)
    colors = recipe_colors(runs)
    for recipe, run_dirs in sorted(runs.items()):
        rows = [r for r in read_metrics(run_dirs[0]) if any(k.startswith("grad_norm/layer_") for k in r)]
        if not rows:
            continue
        color = colors[recipe]
        first, last = rows[0], rows[-1]
        early.plot(layer_norms(first), marker="o", ms=3, color=color, label=recipe)
        late.plot(layer_norms(last), marker="o", ms=3, color=color, label=f"{recipe} (step {last['step']:.0f})")
    early.set(title="per-layer gradient norm at step 0 (initialization)", xlabel="block", ylabel="||grad W||",
              yscale="log")  # fmt: skip
    late.set(title="per-layer gradient norm late in training", xlabel="block", yscale="log")
    return save_figure(fig, (early, late), (early, late), out_dir / "grad_norms.png")


def plot_lr_sensitivity(grid: list[dict], unigram: float | None, out_dir: Path) -> Path:
    """Final validation loss against peak LR (log axis): a line per recipe and warmup, the unigram level dashed.

    ``grid`` rows: recipe, lr, warmup, val_loss_mean (over the seeds that did not diverge; None where none
    did), n_diverged, status, chosen. A setting where any seed diverged is drawn as a cross at the top of
    the axes, not dropped.
    """
    fig, ax = plt.subplots(figsize=(8, 5), dpi=90)
    warmups = sorted({g["warmup"] for g in grid if g["warmup"] is not None})
    styles = dict(zip(warmups, ["-", "--", ":", "-."] * 4))
    finite = [g["val_loss_mean"] for g in grid if g["val_loss_mean"] is not None]
    top = max(finite + ([unigram] if unigram else [])) + 0.2 if finite else 1.0
    colors = recipe_colors(g["recipe"] for g in grid)
    for recipe, color in colors.items():
        for warmup in sorted({g["warmup"] for g in grid if g["recipe"] == recipe}, key=lambda w: (w is None, w)):
            rows = sorted((g for g in grid if g["recipe"] == recipe and g["warmup"] == warmup and g["lr"] is not None),
                          key=lambda g: g["lr"])  # fmt: skip
            ok = [g for g in rows if g["val_loss_mean"] is not None and not g.get("n_diverged")]
            label = recipe if len(warmups) < 2 else f"{recipe}, warmup {warmup}"
            ax.plot([g["lr"] for g in ok], [g["val_loss_mean"] for g in ok], marker="o", ms=4, color=color,
                    ls=styles.get(warmup, "-"), label=label)  # fmt: skip
            chosen = [g for g in ok if g["chosen"]]
            ax.plot([g["lr"] for g in chosen], [g["val_loss_mean"] for g in chosen], marker="*", ms=12, color=color,
                    ls="none")  # fmt: skip
            bad = [g for g in rows if g not in ok]  # a seed diverged: the setting does not train every time
            ax.plot([g["lr"] for g in bad], [top] * len(bad), marker="x", ms=8, color=color, ls="none")
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
        )  # x in axes fraction: stays in view on a log axis
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="final validation loss (nats/token)",
           title="LR sensitivity (star: chosen setting; x: a seed diverged)")  # fmt: skip
    return save_figure(fig, (ax,), (ax,), out_dir / "lr_sensitivity.png")

"""The composite gain of the stream mixes (HC, mHC) over a suite's runs: the suite table's third part and figure.

Each run with hyper-connections logs mHC's Amax Gain Magnitude (arXiv 2512.24880, section 3.1) as training goes:
``hc/gain_forward``, the largest absolute row sum of the product of every sublayer's ``H_res``, and
``hc/gain_backward``, its largest column sum, each ``H_res`` averaged over the batch's tokens before they are
composed (``composite_gain`` in resnorm_lm/model/hyper_connections.py; the paper's per-token average of each token's
own composite, larger for HC, is ``resnorm-lm stream-gain``, resnorm_lm/analysis/token_gain.py). The
paper reports a peak of about 3000 for HC against about 1.6 for mHC at 27B; what a 3.4M-parameter model can say
is the direction, and how it depends on the LR.

For each recipe whose runs log it: the gain at the end of training and its peak over training, in both directions,
over the pick's fresh seeds (median and range: the gains span orders of magnitude, so no mean and no t interval),
and the selection seed's final gains at each LR of the pick's warmup. Both directions, because they differ where
it matters: mHC's Sinkhorn-Knopp ends on rows, so every ``H_res`` has rows summing to 1 and the forward gain is 1
to rounding by construction; only the backward gain (columns, which 20 iterations leave approximate) can move.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from resnorm_lm.analysis.evidence import spread
from resnorm_lm.analysis.plots import panels, save_figure
from resnorm_lm.model.hyper_connections import GAIN_BACKWARD, GAIN_FORWARD
from resnorm_lm.train.runs import RunDir

if TYPE_CHECKING:
    from resnorm_lm.analysis.suite_report import TunedReport


def gain_trace(run_dir: Path) -> list[tuple[float, float, float]]:
    """[(step, forward gain, backward gain)] from a run's metrics.csv, in its order; [] where it logs none."""
    return [
        (r["step"], r[GAIN_FORWARD], r[GAIN_BACKWARD])
        for r in RunDir(run_dir).metrics()
        if "step" in r and GAIN_FORWARD in r and GAIN_BACKWARD in r
    ]


def gain_warmup(report: TunedReport, recipe: str) -> float:
    """The warmup whose LRs the by-LR column and the figure show: the pick's, or the first while none is made."""
    pick = report.selections[recipe].pick
    return pick.warmup if pick else report.design.warmups[0]


def gain_rows(report: TunedReport) -> list[dict[str, Any]]:
    """One row per recipe that logs the gain: at its pick's fresh seeds, the final and the peak gain, forward and
    backward (each the ``spread`` over seeds); and ``by_lr``, the selection seed's final gains, forward / backward,
    at each LR of the pick's warmup (or of the first warmup while no pick is made)."""
    rows = []
    for recipe in report.suite.recipes:
        sel = report.selections[recipe]
        seeds = report.fresh(recipe, sel.pick, report.design.seeds)
        traces = {k: gain_trace(report.run_dir(o.spec)) for k, o in seeds.items()}
        traces = {k: t for k, t in traces.items() if t}
        warmup = gain_warmup(report, recipe)
        by_lr = {
            spec.setting.lr: trace[-1][1:]
            for spec in report.outcomes
            if spec.recipe == recipe and spec.seed == report.design.selection_seed and spec.setting.warmup == warmup
            if (trace := gain_trace(report.run_dir(spec)))
        }
        if not traces and not by_lr:
            continue
        rows.append(
            {
                "recipe": recipe,
                "seeds": len(traces),
                "final_forward": spread([t[-1][1] for t in traces.values()]),
                "final_backward": spread([t[-1][2] for t in traces.values()]),
                "peak_forward": spread([max(g for _, g, _ in t) for t in traces.values()]),
                "peak_backward": spread([max(g for _, _, g in t) for t in traces.values()]),
                "warmup": warmup,
                "by_lr": ", ".join(f"{lr:g}: {f:.3g} / {b:.3g}" for lr, (f, b) in sorted(by_lr.items())),
            }
        )
    return rows


def gain_table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown of ``gain_rows``; nothing where no recipe logs the gain."""
    if not rows:
        return []
    lines = [
        "",
        "Stream-mix gain (HC, mHC): the composite gain of every sublayer's `H_res` (mHC's Amax Gain Magnitude; 1 at "
        "init, about 3000 for HC and 1.6 for mHC at 27B in that paper), each `H_res` averaged over the training "
        "batch's tokens before they are composed; the paper averages each token's own composite's gain, which for HC "
        "is larger (`resnorm-lm stream-gain` measures both at a run's final weights). At the end of training and at "
        "its peak, over "
        "the pick's fresh seeds: median (min..max). Forward: the largest row sum (what a stream can receive); "
        "backward: the largest column sum (what one stream sends on, the gradient's gain). mHC's forward gain is 1 "
        "by construction (its Sinkhorn-Knopp ends on rows); its backward gain shows how far 20 iterations leave the "
        "columns. By LR: the selection seed's final gains, forward / backward, at each LR, at the pick's warmup.",
        "",
        "| recipe | seeds | final gain (forward) | final gain (backward) | peak gain (forward) | peak gain (backward) "
        "| warmup | by LR (forward / backward) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['recipe']}` | {r['seeds']} | {r['final_forward']} | {r['final_backward']} | "
            f"{r['peak_forward']} | {r['peak_backward']} | {r['warmup']:g} | {r['by_lr'] or '-'} |"
        )
    return lines


def plot_trace(ax: Any, trace: list[tuple[float, float, float]], label: str | None, **style: Any) -> None:
    """One run's ``gain_trace`` on ``ax``: the forward gain solid (labelled), the backward gain dashed."""
    if trace:
        steps = [t[0] for t in trace]
        ax.plot(steps, [t[1] for t in trace], label=label, **style)
        ax.plot(steps, [t[2] for t in trace], ls="--", **style)


def plot_gain(report: TunedReport, out_dir: Path) -> Path | None:
    """One panel per recipe that logs the gain: the gain against the step, log scale, forward solid and backward
    dashed; a colour per LR at the selection seed (the pick's warmup) and the pick's fresh seeds in black."""
    import matplotlib.pyplot as plt

    recipes = [r["recipe"] for r in gain_rows(report)]
    if not recipes:
        return None
    fig, axes = panels(len(recipes), ncols=min(3, len(recipes)), width=3.6, height=2.8)
    lrs = sorted({s.setting.lr for s in report.outcomes})
    colors = dict(zip(lrs, plt.cm.viridis([i / max(len(lrs) - 1, 1) for i in range(len(lrs))])))
    for ax, recipe in zip(axes, recipes):
        sel = report.selections[recipe]
        warmup = gain_warmup(report, recipe)
        ax.set_title(recipe, fontsize=9)
        ax.set_yscale("log")
        selection = sorted(
            (s for s in report.outcomes if s.recipe == recipe and s.seed == report.design.selection_seed),
            key=lambda s: s.setting.lr,
        )
        for spec in (s for s in selection if s.setting.warmup == warmup):
            plot_trace(
                ax, gain_trace(report.run_dir(spec)), f"{spec.setting.lr:g}", lw=1, color=colors[spec.setting.lr]
            )
        fresh = [
            t
            for o in report.fresh(recipe, sel.pick, report.design.seeds).values()
            if (t := gain_trace(report.run_dir(o.spec)))
        ]
        for i, trace in enumerate(fresh):
            label = "pick, fresh seeds" if i == 0 else None
            plot_trace(ax, trace, label, lw=0.8, color="black", alpha=0.6)
        ax.axhline(1.0, ls=":", lw=0.8, color="gray")
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("composite gain")
    fig.suptitle(
        "Stream-mix gain over training, forward solid, backward dashed:\na colour per LR (selection seed), the "
        "pick's seeds in black",
        fontsize=9,
    )
    return save_figure(fig, axes, axes[:1], out_dir / "stream_gain.png")

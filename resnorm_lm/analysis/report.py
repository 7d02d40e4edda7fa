"""The comparison as a reader sees it: compare.md (the table at the picks, then the grid), compare.csv and
grid.csv, and the figures at the chosen settings (loss curves, gradient norms, stream RMS, LR sensitivity,
clipping). The rows come from ``tables.py``; this module formats and writes them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from resnorm_lm.analysis.sweep import NOT_LEARNING_NATS, RunSpec, Selection, chosen_runs
from resnorm_lm.data.cache import atomic_write, write_csv_atomic
from resnorm_lm.train.runs import RunDir


def num(mean: float | None, std: float | None, digits: int = 3) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std else "")


def markdown_report(
    table: list[dict],
    grid: list[dict],
    profile: str,
    command: str,
    unigram: float | None,
    hardware: str,
    depths: bool = False,
    provenance: list[str] | None = None,
) -> str:
    """compare.md; with ``depths`` a "layers" column after the recipe says which depth each row is; ``provenance``:
    the arithmetic the runs computed with (``provenance.py``), a line each."""
    runs = sum(r["n_runs"] for r in table)
    hours = sum(r["train_s"] for r in table) / 3600
    lines = [
        f"# Comparison: profile `{profile}`",
        "",
        f"Command: `{command}`",
        "",
        f"Date: {time.strftime('%Y-%m-%d')}. Hardware: {hardware}. Cost: {runs} runs, {hours:.2f} h of training.",
        "",
        *(f"Provenance: {line}" for line in provenance or []),
        *([""] if provenance else []),
        "Each recipe at its own setting: the (peak lr, warmup) with the lowest mean validation loss over the "
        "seeds run at it; test is evaluated only at that setting. Mean ± standard deviation over seeds. "
        f"Unigram reference (validation cross-entropy of the train split's token frequencies): "
        f"{num(unigram, None)} nats; within {NOT_LEARNING_NATS} nats of it (or above) is 'not learning'.",
        "",
        "Eval precision: the precision the numbers were measured at (by default each run's training "
        "precision; `--eval-precision` to choose).",
        "",
        "| recipe | lr | warmup | seeds | val loss | val ppl | val bpb | test ppl | test bpb | eval precision "
        "| status |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if depths:
        lines[-2:] = [with_layers(line, "layers") for line in lines[-2:]]
    for r in table:
        lr = "-" if r.get("lr") is None else f"{r['lr']:g}"
        lr += f" ({r['lr_edge']} of grid)" if r.get("lr_edge") else ""
        warmup = "-" if r.get("warmup") is None else str(r["warmup"])
        warmup += f" ({r['warmup_edge']} of grid)" if r.get("warmup_edge") else ""
        name = r["recipe"] + (f" [{r['provenance']}]" if r.get("provenance") else "")
        cells = [name, lr, warmup, str(r.get("n_seeds", 0))]
        for key, digits in (("val_loss", 3), ("val_ppl", 1), ("val_bpb", 3), ("test_ppl", 1), ("test_bpb", 3)):
            cells.append(num(r.get(f"{key}_mean"), r.get(f"{key}_std"), digits))
        line = "| " + " | ".join([*cells, r.get("eval_precision") or "-", r["status"]]) + " |"
        lines.append(with_layers(line, r.get("n_layer")) if depths else line)
    inits = {r["recipe"]: r["init"] for r in table if r.get("init")}
    if len(set(inits.values())) == 1:
        lines += ["", f"Init: `{next(iter(inits.values()))}` in every run (`model.arch.init`)."]
    elif inits:
        lines += ["", "Init (`model.arch.init`): " + "; ".join(f"{r} `{i}`" for r, i in inits.items()) + "."]
    if any(r.get("lr_edge") or r.get("warmup_edge") for r in table):
        lines += [
            "",
            "A chosen lr (or warmup) at the edge of the grid means the grid should be widened on that "
            "side (an lr's grid: the lrs run at the chosen warmup; a warmup's: those run at the chosen lr).",
        ]
    lines += [
        "",
        "## The grid (validation loss, mean over the seeds run at each setting that did not diverge)",
        "",
        "Clipped: the mean fraction of optimizer steps whose global gradient norm exceeded the clip "
        "(`-`: not recorded, or no clipping by norm).",
        "",
    ]
    header = [
        "| recipe | lr | warmup | seeds | val loss | clipped | status | chosen |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [with_layers(line, "layers") for line in header] if depths else header
    for g in grid:
        lr = "recipe" if g["lr"] is None else f"{g['lr']:g}"
        warmup = "recipe" if g["warmup"] is None else str(g["warmup"])
        loss = num(g["val_loss_mean"], g["val_loss_std"])
        chosen = "yes" if g["chosen"] else ""
        clipped = "-" if g.get("clipped_mean") is None else f"{g['clipped_mean']:.0%}"
        line = f"| {g['recipe']} | {lr} | {warmup} | {g['n_seeds']} | {loss} | {clipped} | {g['status']} | {chosen} |"
        lines.append(with_layers(line, g.get("n_layer")) if depths else line)
    return "\n".join(lines) + "\n"


def with_layers(line: str, layers: Any) -> str:
    """A markdown table line with a cell inserted after the first (the recipe): its depth."""
    cells = line.split("|")  # ['', ' recipe ', ...]
    cell = "---" if set(cells[1]) == {"-"} else f" {'-' if layers is None else layers} "
    return "|".join([*cells[:2], cell, *cells[2:]])


def hardware_of(run_dirs: list[Path]) -> str:
    """The machines the runs were trained on, from their manifests (older manifests say less: used only alone)."""
    found: dict[str, bool] = {}  # description -> recorded by a newer manifest (CPU model and bf16 known)
    for run_dir in run_dirs:
        manifest = RunDir(run_dir).manifest()
        if not manifest:
            continue
        hw = manifest.get("hardware", {})
        if hw.get("gpus"):
            found[", ".join(hw["gpus"])] = True
            continue
        bf16 = {True: ", native bf16", False: ", no native bf16"}.get(hw.get("cpu_native_bf16"), "")
        found[f"{hw.get('cpu', 'CPU')} ({hw.get('cpu_count')} cores{bf16}, no GPU)"] = bool(bf16)
    described = sorted(d for d, full in found.items() if full) or sorted(found)
    return "; ".join(described) or "unknown"


def arm_label(sel: Selection, depths: bool) -> str:
    """How figures name a (recipe, depth): the recipe, and its depth on a depth axis."""
    return f"{sel.recipe}, {sel.n_layer} blocks" if depths else sel.recipe


def write_report(out_dir: Path, report: str, table: list[dict], grid: list[dict]) -> None:
    """compare.md (``report``, from ``markdown_report``), compare.csv (``table``) and grid.csv (``grid``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_write(out_dir / "compare.md", "w") as f:
        f.write(report)
    write_csv_atomic(out_dir / "compare.csv", table)
    write_csv_atomic(out_dir / "grid.csv", grid)


def plot_comparison(
    selections: dict[Any, Selection],
    runs: dict[RunSpec, Path],
    grid: list[dict],
    unigram: float | None,
    out_dir: Path,
    depths: bool,
    lr_grid: bool,
) -> None:
    """The figures of every comparison: LR sensitivity and clipping over the grid (``lr_grid``: an LR axis was
    swept), and at the chosen settings loss curves, gradient norms and stream RMS (a line per recipe, and per
    depth with ``depths``)."""
    from resnorm_lm.analysis.plots import (
        plot_clipping,
        plot_grad_norms,
        plot_loss_curves,
        plot_lr_sensitivity,
        plot_stream_rms,
    )

    at_chosen = {arm_label(sel, depths): [d for _, d in chosen_runs(sel, runs)] for sel in selections.values()}
    at_chosen = {label: dirs for label, dirs in at_chosen.items() if dirs}
    if lr_grid:  # with depths, a line per (recipe, depth)
        labels = {(sel.recipe, sel.n_layer): arm_label(sel, depths) for sel in selections.values()}
        labelled = [{**g, "recipe": labels[g["recipe"], g["n_layer"]]} for g in grid]
        plot_lr_sensitivity(labelled, unigram, out_dir)
        if any(g["clipped_mean"] is not None for g in grid):
            plot_clipping(labelled, out_dir)
    else:
        print("compare: no LRS grid: lr_sensitivity.png not drawn")
    if at_chosen:
        plot_loss_curves(at_chosen, out_dir)
        plot_grad_norms(at_chosen, out_dir)
        plot_stream_rms(at_chosen, out_dir)

"""The comparison as a reader sees it: compare.md (the table at the picks, then the grid), compare.csv and
grid.csv, and the figures at the chosen settings (loss curves, gradient norms, stream RMS, LR sensitivity,
clipping). The rows come from ``tables.py``; this module formats and writes them.

With a depth axis, the depth's own: depth.md/.csv, its figures, the layer contribution at the picks."""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from resnorm_lm.analysis.intervals import group_rows, num
from resnorm_lm.analysis.layer_contribution import block_means
from resnorm_lm.analysis.sweep import NOT_LEARNING_NATS, Arm, RunSpec, Selection, chosen_runs
from resnorm_lm.data.cache import atomic_write, write_csv_atomic
from resnorm_lm.train.runs import RunDir


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


# ---------------------------------------------------------------------------------------------------------------------
# The depth axis of a comparison (``compare --depths``): depth.md/.csv (each recipe's validation loss at its pick,
# depth by depth, and the sizes), the depth figures (loss and chosen LR against depth, stability maps, gradient
# norms and stream RMS per depth) and the layer contribution at the picks (layer_contribution.md/.csv/.png,
# measured by ``resnorm_lm.analysis.layer_contribution``). docs/depth.md describes them.


def depth_rows(table: list[dict]) -> list[dict]:
    """depth.csv: each (recipe, depth) at its pick, with its size and the tokens it saw per parameter."""
    keys = [
        "recipe",
        "n_layer",
        "params",
        "tokens",
        "lr",
        "warmup",
        "lr_edge",
        "warmup_edge",
        "n_seeds",
        "val_loss_mean",
        "val_loss_std",
        "test_loss_mean",
        "test_loss_std",
        "status",
    ]
    rows = []
    for r in sorted(table, key=lambda r: (r["recipe"], r.get("n_layer") or 0)):
        row = {k: r.get(k) for k in keys}
        row["tokens_per_param"] = r["tokens"] / r["params"] if r.get("tokens") and r.get("params") else None
        rows.append(row)
    return rows


def depth_markdown(rows: list[dict], unigram: float | None, command: str) -> str:
    """depth.md: validation loss at each pick, a recipe per line and a depth per column, and the sizes."""
    depths = sorted({r["n_layer"] for r in rows if r.get("n_layer")})
    lines = [
        "# Depth: each recipe tuned at each depth",
        "",
        f"Command: `{command}`",
        "",
        "Validation loss at each (recipe, depth)'s own chosen LR (mean ± std over the seeds at the pick), "
        "and the LR. Every depth trains on the same tokens, so a deeper model has more parameters per "
        f"token. Unigram reference: {num(unigram, None)} nats.",
        "",
        "| recipe | " + " | ".join(f"depth {d}" for d in depths) + " |",
        "|---" * (len(depths) + 1) + "|",
    ]
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        cells = []
        for depth in depths:
            r = next((r for r in rows if r["recipe"] == recipe and r.get("n_layer") == depth), None)
            if r is None:
                cells.append("")
                continue
            if r.get("val_loss_mean") is None:
                cells.append(r["status"])
                continue
            notes = [f"{r['lr_edge']} of grid"] if r.get("lr_edge") else []
            notes += [f"warmup {r['warmup']}: {r['warmup_edge']} of grid"] if r.get("warmup_edge") else []
            notes += [] if r["status"] == "ok" else [r["status"]]
            note = f" ({'; '.join(notes)})" if notes else ""
            cells.append(f"{num(r['val_loss_mean'], r.get('val_loss_std'))} @ {r['lr']:g}{note}")
        lines.append(f"| {recipe} | " + " | ".join(cells) + " |")
    sizes = []
    for depth in depths:
        at = [r for r in rows if r.get("n_layer") == depth and r.get("params")]
        if at:
            params = sorted({r["params"] for r in at})
            span = f"{params[0]:,}" + (f"-{params[-1]:,}" if len(params) > 1 else "")
            sizes.append(
                f"{depth} blocks: {span} parameters, {at[0]['tokens']:,} tokens "
                f"({at[0]['tokens'] / params[-1]:.2f} tokens per parameter)"
            )
    if sizes:
        lines += ["", "Sizes (parameters counted once, embeddings included; tokens seen in training):", ""]
        lines += [f"- {line}" for line in sizes]
    return "\n".join(lines) + "\n"


def contribution_rows(
    picked: dict[tuple[str, int], list[tuple[RunSpec, Path]]], n_tokens: int
) -> tuple[list[dict], list[str]]:
    """layer_contribution.csv: a row per (recipe, depth, seed, block), measured on the runs at the picks;
    and the runs that could not be measured (no checkpoint and no cached measurement)."""
    from resnorm_lm.analysis.layer_contribution import run_contribution

    rows, missing = [], []
    for (recipe, n_layer), pairs in sorted(picked.items()):
        for spec, run_dir in pairs:
            record = run_contribution(run_dir, n_tokens)
            if record is None:
                missing.append(str(run_dir))
                continue
            per_block = zip(record["skipped_loss"], record["loss_increase"], record["angular_distance"])
            for layer, (skipped, increase, angle) in enumerate(per_block):
                rows.append(
                    {
                        "recipe": recipe,
                        "n_layer": n_layer,
                        "seed": spec.seed,
                        "layer": layer,
                        "tokens": record["tokens"],
                        "loss": record["loss"],
                        "loss_skipped": skipped,
                        "loss_increase": increase,
                        "angular_distance": angle,
                    }
                )
    return rows, missing


NEAR_IDENTITY_NATS = 0.01  # a block whose removal costs less than this does next to nothing


def contribution_markdown(rows: list[dict]) -> str:
    """layer_contribution.md: per (recipe, depth), means over seeds of the per-block numbers, summarised by
    the first and last quarter of the blocks (every block's numbers are in the CSV)."""
    tokens = sorted({r["tokens"] for r in rows})
    lines = [
        "# Layer contribution at the chosen runs",
        "",
        "Per block l: the validation loss increase when block l is skipped (its output replaced by its input; "
        "LNS arXiv 2502.05795 and Mix-LN arXiv 2412.13795 measure the drop when one layer is removed), and "
        "the angular distance between its input and output, (1/pi) arccos(cos_sim(x_l, x_{l+1})) averaged "
        "over tokens (Gromov et al. 2024, arXiv 2403.17887). ResiDual: skipping passes both streams on; the "
        "distance is on its post-norm stream. Measured on the first "
        f"{', '.join(f'{t:,}' for t in tokens)} validation tokens, at the final weights of each seed at the "
        "pick; means over the seeds. First / last quarter: the mean over the first / last ceil(L/4) blocks.",
        "",
        "| recipe | blocks | seeds | loss | Δloss first quarter | Δloss last quarter | largest Δloss (block) | "
        "angle first quarter | angle last quarter | blocks under 0.01 nats |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (recipe, n_layer), mine in sorted(group_rows(rows, ("recipe", "n_layer")).items()):
        seeds = sorted({r["seed"] for r in mine})
        layers, increase = block_means(mine, "loss_increase")
        _, angle = block_means(mine, "angular_distance")
        q = math.ceil(len(layers) / 4)
        worst = max(range(len(layers)), key=lambda i: increase[i])
        loss = statistics.fmean(r["loss"] for r in mine if r["layer"] == 0)
        near_identity = sum(v < NEAR_IDENTITY_NATS for v in increase)
        cells = [
            recipe,
            str(n_layer),
            str(len(seeds)),
            f"{loss:.3f}",
            f"{statistics.fmean(increase[:q]):.3f}",
            f"{statistics.fmean(increase[-q:]):.3f}",
            f"{increase[worst]:.3f} ({layers[worst]})",
            f"{statistics.fmean(angle[:q]):.3f}",
            f"{statistics.fmean(angle[-q:]):.3f}",
            f"{near_identity}/{len(layers)}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_depth_results(
    selections: dict[Arm, Selection],
    runs: dict[RunSpec, Path],
    table: list[dict],
    grid: list[dict],
    unigram: float | None,
    out_dir: Path,
    command: str,
    contribution_tokens: int,
) -> list[str]:
    """depth.md/.csv, depth_loss.png, depth_lr.png, stability_map.png, depth_grad_norms.png and the layer
    contribution (md, csv, png) at the picks; returns the names written."""
    from resnorm_lm.analysis import plots

    rows = depth_rows(table)
    with atomic_write(out_dir / "depth.md", "w") as f:
        f.write(depth_markdown(rows, unigram, command))
    write_csv_atomic(out_dir / "depth.csv", rows)
    plots.plot_depth_loss(table, unigram, out_dir)
    plots.plot_depth_lr(table, out_dir)
    plots.plot_stability_maps(grid, unigram, out_dir)
    written = ["depth.md", "depth.csv", "depth_loss.png", "depth_lr.png", "stability_map.png"]
    picked = {(sel.recipe, sel.n_layer): chosen_runs(sel, runs) for sel in selections.values()}
    picked = {key: pairs for key, pairs in picked.items() if pairs}
    if picked:  # one seed per pick: the lowest
        at_picks = {key: pairs[0][1] for key, pairs in picked.items()}
        plots.plot_depth_grad_norms(at_picks, out_dir)
        written.append("depth_grad_norms.png")
        if plots.plot_depth_stream_rms(at_picks, out_dir):
            written.append("depth_stream_rms.png")
    if contribution_tokens > 0 and picked:
        print(f"compare: layer contribution of {sum(map(len, picked.values()))} run(s) at the picks", flush=True)
        contribution, missing = contribution_rows(picked, contribution_tokens)
        if missing:
            print(
                f"compare: layer contribution: {len(missing)} run(s) have neither a checkpoint nor a cached "
                f"measurement and are left out: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}",
                file=sys.stderr,
            )
        if contribution:
            with atomic_write(out_dir / "layer_contribution.md", "w") as f:
                f.write(contribution_markdown(contribution))
            write_csv_atomic(out_dir / "layer_contribution.csv", contribution)
            plots.plot_layer_contribution(contribution, out_dir)
            written += ["layer_contribution.md", "layer_contribution.csv", "layer_contribution.png"]
    return written

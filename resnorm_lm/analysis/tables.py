"""The comparison's tables as rows: one per (recipe, depth) at its pick (compare.csv) and one per setting of
its grid (grid.csv), with the order they are ranked in.

Building a row only reads: the runs' eval.json (``eval_records.evaluated``) and config. The evaluations a
row needs (validation everywhere, test at the picks: ``eval_records.ensure_picks_tested``) are made before.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from resnorm_lm.analysis.eval_records import eval_precisions, evaluated
from resnorm_lm.analysis.evaluate import RUN
from resnorm_lm.analysis.sweep import RunSpec, Selection
from resnorm_lm.train.runs import RunDir

METRICS = ["loss", "ppl", "bpb"]


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None, None
    return statistics.fmean(finite), (statistics.stdev(finite) if len(finite) > 1 else 0.0)


def recipe_row(
    sel: Selection,
    runs: dict[RunSpec, Path],
    unigram: float | None,
    seeds_wanted: int | None = None,
    precision: str = RUN,
) -> dict[str, Any]:
    """One table row: the chosen setting, validation and test over its seeds, flags, and the recipe's cost (test
    as recorded: a pick whose test split was not evaluated has none).

    A pick with fewer finished seeds than ``seeds_wanted`` (runs not trained with --no-train, or failed) says
    so in its status: its mean is not comparable in weight with a full pick's."""
    mine = {s: d for s, d in runs.items() if s.arm == sel.arm}
    summaries = [RunDir(d).summary() for d in mine.values()]
    row: dict[str, Any] = {
        "recipe": sel.recipe,
        "n_layer": sel.n_layer,
        "n_runs": len(mine),
        "train_s": round(sum(s.get("wall_s") or 0 for s in summaries), 1),
        "unigram_loss": unigram,
    }
    if sel.chosen is None:
        n_div = sum(sc.n_diverged for sc in sel.scores)
        row["status"] = f"diverged at every setting ({n_div} runs)" if sel.scores else "missing"
        return row
    setting = sel.chosen.setting
    chosen = {s: d for s, d in mine.items() if s.setting == setting}
    row.update(
        lr=setting.lr, warmup=setting.warmup, lr_edge=sel.lr_edge, warmup_edge=sel.warmup_edge, n_seeds=len(chosen)
    )
    row["eval_precision"] = eval_precisions(list(chosen.values()))
    for split, prefix in (("validation", "val"), ("test", "test")):
        results = [evaluated(d, split, precision) or {} for d in chosen.values()]
        for metric in METRICS:
            row[f"{prefix}_{metric}_mean"], row[f"{prefix}_{metric}_std"] = mean_std([r.get(metric) for r in results])
    facts = [RunDir(d).summary() for d in chosen.values()]
    row["schedule"] = ", ".join(sorted({RunDir(d).optim().get("schedule", "cosine") for d in chosen.values()}))
    row["init"] = ", ".join(sorted({i for i in (RunDir(d).init() for d in chosen.values()) if i})) or None
    row["params"] = facts[0].get("params")
    row["tokens"] = facts[0].get("tokens")
    tps = [f["tokens"] / f["wall_s"] for f in facts if f.get("tokens") and f.get("wall_s")]
    row["tokens_per_s"] = statistics.fmean(tps) if tps else None
    stuck = [o for o in sel.chosen.outcomes if o.not_learning(unigram)]
    row["status"] = "not learning" if stuck else "ok"
    if stuck and len(stuck) < len(sel.chosen.outcomes):
        row["status"] = f"not learning {len(stuck)}/{len(sel.chosen.outcomes)}"
    if seeds_wanted and len(chosen) < seeds_wanted:
        row["status"] += f"; pick has {len(chosen)} of {seeds_wanted} seeds"
    return row


def grid_rows(
    selections: dict[Any, Selection], unigram: float | None, runs: dict[RunSpec, Path] | None = None
) -> list[dict[str, Any]]:
    """One row per recipe (at each depth) and setting: mean validation loss over the seeds run there, its flags,
    the mean fraction of steps whose gradient clip bound, and the precision it was evaluated at (from the
    ``runs``' eval.json)."""
    rows, runs = [], runs or {}
    for sel in selections.values():
        for score in sorted(sel.scores, key=lambda s: s.setting):
            n, stuck = len(score.outcomes), sum(o.not_learning(unigram) for o in score.outcomes)
            flags = [
                f"{what} {count}/{n}"
                for what, count in (("diverged", score.n_diverged), ("not learning", stuck))
                if count
            ]
            # the loss shown is over the seeds that did not diverge; such a setting is never chosen (score.mean)
            clips = [RunDir(runs[o.spec]).summary().get("clip") for o in score.outcomes if o.spec in runs]
            clipped = [c["clipped_fraction"] for c in clips if c]  # runs from before the record have none
            rows.append(
                {
                    "recipe": sel.recipe,
                    "n_layer": sel.n_layer,
                    "lr": score.setting.lr,
                    "warmup": score.setting.warmup,
                    "n_seeds": n,
                    "val_loss_mean": statistics.fmean(score.losses) if score.losses else None,
                    "val_loss_std": score.std if score.losses else None,
                    "n_diverged": score.n_diverged,
                    "status": ", ".join(flags) or "ok",
                    "clipped_mean": statistics.fmean(clipped) if clipped else None,
                    "eval_precision": eval_precisions([runs[o.spec] for o in score.outcomes if o.spec in runs]),
                    "chosen": sel.chosen is not None and score.setting == sel.chosen.setting,
                }
            )
    return rows


def sort_key(row: dict[str, Any]) -> tuple:
    trained = row.get("val_loss_mean") is not None
    return (not trained, row["status"] != "ok", row.get("val_loss_mean") or math.inf)


def depth_sort_key(row: dict[str, Any]) -> tuple:
    """With a depth axis: depth by depth, each ranked as without one."""
    return (row.get("n_layer") or 0, *sort_key(row))

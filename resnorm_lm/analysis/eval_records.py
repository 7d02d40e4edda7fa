"""Evaluation bookkeeping for compare: which numbers a run's eval.json holds and whether they count, measuring
those missing (validation on every finished run, test at the picks only), each run's validation outcome, and
the unigram reference of the data the runs trained on.

Everything is measured here, before any table is built: the tables (``tables.py``) only read eval.json.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from resnorm_lm.analysis.evaluate import RUN, eval_precision, evaluate_paths
from resnorm_lm.analysis.sweep import RunOutcome, RunSpec, Selection, chosen_runs
from resnorm_lm.train.precision import uses_cuda
from resnorm_lm.train.runs import RunDir


def evaluated(run_dir: Path, split: str, precision: str = RUN) -> dict[str, Any] | None:
    """The split's numbers from eval.json when they were measured on the run's final weights, at the precision
    ``precision`` asks for (``eval_precision``). Numbers measured at another precision, or before eval.json
    recorded it, are measured again where the checkpoint is there; without it they are used as they are
    (the tables show their precision, or "not recorded")."""
    run = RunDir(run_dir)
    summary = run.summary()
    ev = summary.get("eval") or {}
    if ev.get("step") != summary.get("step") or split not in ev:
        return None
    wanted = eval_precision(precision, ev.get("trained_precision"), uses_cuda("auto")).precision
    if ev.get("precision") == wanted or not run.has_checkpoint():
        return ev[split]
    return None


def eval_precisions(run_dirs: list[Path]) -> str | None:
    """The precisions the runs' recorded evaluations ran at, for the tables."""
    found = {ev.get("precision") or "not recorded" for d in run_dirs if (ev := RunDir(d).summary().get("eval"))}
    return ", ".join(sorted(found)) or None


def ensure_evaluated(run_dirs: list[Path], split: str, precision: str = RUN) -> None:
    """Evaluate (every token of ``split`` once) the runs not yet evaluated at their last step and at ``precision``."""
    todo = [d for d in run_dirs if evaluated(d, split, precision) is None and not RunDir(d).summary().get("diverged")]
    gone = [str(d) for d in todo if not RunDir(d).has_checkpoint()]
    if gone:
        raise SystemExit(
            f"resnorm-lm compare: {len(gone)} finished run(s) need the {split} split evaluated but their "
            f"checkpoints are gone: {', '.join(gone[:3])}{' ...' if len(gone) > 3 else ''}. Put "
            f"checkpoints/last.ckpt back, or delete the run directory to retrain it."
        )
    if todo:
        evaluate_paths([str(d) for d in todo], [split], precision=precision, progress=False)


def ensure_picks_tested(selections: Iterable[Selection], runs: dict[RunSpec, Path], precision: str = RUN) -> None:
    """The test split evaluated on every run at each pick (and on no other run: test never chooses)."""
    for sel in selections:
        ensure_evaluated([run_dir for _, run_dir in chosen_runs(sel, runs)], "test", precision)


def outcome(spec: RunSpec, run_dir: Path, precision: str = RUN) -> RunOutcome:
    summary = RunDir(run_dir).summary()
    val = evaluated(run_dir, "validation", precision)
    loss = val.get("loss") if val else None
    diverged = bool(summary.get("diverged")) or (loss is not None and not math.isfinite(loss))
    return RunOutcome(spec, None if diverged else loss, diverged)


def unigram_reference(run_dir: Path) -> float:
    """The unigram cross-entropy of the data the run trained on (its settings from the run's config.yaml)."""
    from resnorm_lm.data.datamodule import TextDataModule
    from resnorm_lm.data.unigram import unigram_cross_entropy

    data = RunDir(run_dir).config()["data"]
    dm = TextDataModule(**data)
    dm.setup()
    return unigram_cross_entropy(dm.prepared)

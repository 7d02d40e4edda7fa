"""``resnorm-lm eval``: perplexity, bits per byte and word-level perplexity of trained runs, as tables.

resnorm-lm eval runs/prenorm-12l/cpu-seed1 runs/postnorm-12l/cpu-seed1 [--split validation test] [--precision run]

Each run is scored on the data it was trained on (refused, exit 2, when that data changed since) at the
precision it was trained with (``--precision 32-true`` for fp32, ``auto`` for this machine's fastest).
What the table compares: bits per byte and word-level perplexity only runs evaluated on the same text (the
same corpus fingerprint and split): one table per evaluation text, ranked within it. Token-level perplexity
also needs the same tokenizer; word-level perplexity does not (the words of one text are the same for every
tokenizer, and so is the probability a model gives the text).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, get_args

import torch
from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT_STR
from lightning.pytorch.utilities import rank_zero_only

from resnorm_lm.analysis.intervals import group_rows
from resnorm_lm.data.cache import write_csv_atomic, write_json_atomic
from resnorm_lm.model.gpt import count_parameters
from resnorm_lm.train.loaded_run import CheckpointError, LoadedRun, load_run
from resnorm_lm.train.precision import (
    AUTO,
    PrecisionChoice,
    PrecisionError,
    Trainer,
    missing_native_bf16,
    resolve_precision,
    uses_cuda,
)
from resnorm_lm.train.runs import RunDir

RUN = "run"  # evaluate at the precision the run trained with
PRECISIONS = (RUN, AUTO, *get_args(_PRECISION_INPUT_STR), "64", "32", "16", "bf16")  # Lightning's, and its aliases
FP16 = ("16-mixed", "16", "16-true", "half")  # need a CUDA GPU (or fp16 weights: NaN losses without a scaler)
SPLITS = {"validation": ("validate", "val"), "test": ("test", "test")}


def eval_precision(requested: str, trained_with: str | None, cuda: bool) -> PrecisionChoice:
    """The precision to evaluate a run at, and why: by default (``run``) the one it trained with, where this
    hardware runs it, else fp32 (said in the reason); ``auto`` is this machine's fastest; others as given."""
    if requested != RUN:
        return resolve_precision(requested, cuda)
    if trained_with is None:
        return PrecisionChoice("32-true", "fp32: the run's training precision is not recorded")
    if not cuda and trained_with in FP16:
        return PrecisionChoice("32-true", f"fp32: the run trained in {trained_with}, which needs a CUDA GPU")
    if cuda and trained_with.startswith("bf16") and not torch.cuda.is_bf16_supported():
        return PrecisionChoice("32-true", f"fp32: the run trained in {trained_with}, which this GPU cannot run")
    reason = "the run's training precision"
    if not cuda and trained_with.startswith("bf16") and missing_native_bf16() is not None:
        reason += " (bf16 is emulated and slow on this CPU: --precision 32-true evaluates in fp32, faster)"
    return PrecisionChoice(trained_with, reason)


def evaluate_run(run: LoadedRun, splits: list[str], precision: str, devices: int, progress: bool = True) -> dict:
    """Every token of each split exactly once (non-overlapping windows, the tail included)."""
    trainer = Trainer(
        accelerator="auto",
        devices=devices,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress,
        limit_val_batches=1.0,
        limit_test_batches=1.0,
    )
    dm = run.datamodule  # set up by load_run, on the data the run trained on
    out: dict[str, Any] = {}
    for split in splits:
        stage, prefix = SPLITS[split]
        getattr(trainer, stage)(run.model, datamodule=dm, verbose=False)
        metrics = {
            k.split("/", 1)[1]: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(prefix + "/")
        }
        stats = dm.manifest.splits[split]
        out[split] = {**metrics, "tokens": stats.tokens, "bytes": stats.bytes, "words": stats.words}
    return out


def training_facts(run: LoadedRun) -> dict[str, Any]:
    """Steps, tokens seen, tokens/s and divergence, from the run directory's records."""
    facts: dict[str, Any] = {"step": run.global_step, "params": count_parameters(run.model)}
    if run.run_dir is None:
        return facts
    summary = RunDir(run.run_dir).summary()
    for key in ("tokens", "wall_s", "diverged", "diverged_reason", "recipe", "profile"):
        if key in summary:
            facts[key] = summary[key]
    if summary.get("tokens") and summary.get("wall_s"):
        facts["tokens_per_s"] = summary["tokens"] / summary["wall_s"]
    return facts


def data_facts(run: LoadedRun) -> dict[str, Any]:
    """Which text and tokenizer the run was evaluated with: what decides what its numbers compare with."""
    m = run.datamodule.manifest
    return {"corpus": m.corpus, "corpus_fingerprint": m.corpus_fingerprint[:12], "tokenizer": m.tokenizer_sha256[:12]}


def text_groups(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows by evaluation text (corpus and its fingerprint; the split is the table's), in order of appearance."""
    return list(group_rows(rows, ("corpus", "corpus_fingerprint")).values())


def comparability_notes(groups: list[list[dict[str, Any]]]) -> list[str]:
    """Why a table is split or leaves a column out."""
    notes = []
    if len(groups) > 1:
        notes.append(
            f"note: these runs were evaluated on {len(groups)} different texts (corpus fingerprints). Bits per byte "
            "and perplexities compare runs only on the same text, so each text has its own table, ranked within "
            "it; runs on different texts are not ranked against each other."
        )
    for group in groups:
        tokenizers = {r["tokenizer"] for r in group}
        if len(tokenizers) > 1:
            notes.append(
                f"note: the runs on {group[0]['corpus']} ({group[0]['corpus_fingerprint']}) use {len(tokenizers)} "
                "tokenizers: token-level perplexity counts different tokens, so it is left out there; bits per "
                "byte and word-level perplexity (per whitespace word of the same text) do not depend on the "
                "tokenizer and are kept."
            )
    return notes


def format_table(rows: list[dict[str, Any]], split: str, token_ppl: bool = True) -> str:
    """Runs ranked by bits per byte (diverged last); ``token_ppl`` only where they share a tokenizer."""
    cols = [
        "run",
        "step",
        "params",
        "tokens",
        "eval_precision",
        f"{split}_ppl",
        f"{split}_bpb",
        f"{split}_word_ppl",
        "tokens_per_s",
        "diverged",
    ]
    if not token_ppl:
        cols.remove(f"{split}_ppl")
    rows = sorted(rows, key=lambda r: (bool(r.get("diverged")), r.get(f"{split}_bpb", math.inf)))

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4f}" if abs(value) < 100 else f"{value:.1f}"
        return "" if value is None else str(value)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def format_tables(rows: list[dict[str, Any]], split: str) -> str:
    """One table per evaluation text; a heading names the text when there are several."""
    groups = text_groups(rows)
    parts = []
    for group in groups:
        if len(groups) > 1:
            parts.append(f"corpus {group[0]['corpus']} (fingerprint {group[0]['corpus_fingerprint']}):\n")
        parts.append(format_table(group, split, token_ppl=len({r["tokenizer"] for r in group}) == 1))
    return "\n\n".join(parts)


def flatten(name: str, facts: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    row = {"run": name, **facts}
    for split, metrics in results.items():
        row.update({f"{split}_{k}": v for k, v in metrics.items()})
    return row


def evaluate_paths(
    paths: list[str],
    splits: list[str],
    precision: str = RUN,
    devices: int = 1,
    cache_dir: str | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Evaluate each run, merge the results into its eval.json, and return one flat row per run."""
    rows = []
    cuda = uses_cuda("auto")
    for path in paths:
        run = load_run(path, cache_dir=cache_dir)  # refuses data that is not what the run trained on
        choice = eval_precision(precision, run.precision, cuda)
        if rank_zero_only.rank == 0:
            print(f"resnorm-lm eval: {path}: {choice.describe()}", file=sys.stderr, flush=True)
        results = evaluate_run(run, splits, choice.precision, devices, progress)
        facts = training_facts(run)
        row = flatten(str(run.run_dir or run.checkpoint), facts, results)
        rows.append({**row, **data_facts(run), "eval_precision": choice.precision})
        if run.run_dir is not None and rank_zero_only.rank == 0:
            run_dir = RunDir(run.run_dir)
            summary = run_dir.summary()
            earlier = summary.get("eval") or {}
            # other splits of the same weights at the same precision are kept; anything else is replaced
            same = earlier.get("step") == run.global_step and earlier.get("precision") == choice.precision
            summary["eval"] = {
                **(earlier if same else {}),
                "checkpoint": str(run.checkpoint),
                "step": run.global_step,
                "precision": choice.precision,
                "precision_reason": choice.reason,
                "trained_precision": run.precision,
                **results,
            }
            write_json_atomic(run_dir.summary_path, summary)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="resnorm-lm eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", help="run directories (their last.ckpt), .ckpt files or export folders")
    parser.add_argument("--split", nargs="+", choices=sorted(SPLITS), default=["validation", "test"])
    parser.add_argument(
        "--precision",
        default=RUN,
        choices=PRECISIONS,
        metavar="PRECISION",
        help="run (default): the precision each run trained with (fp32 where this hardware cannot "
        "run it, said aloud); 32-true: fp32; auto: this machine's fastest (bf16-mixed where "
        "bf16 is fast here, else 32-true on CPU); or any other Lightning precision",
    )
    parser.add_argument("--devices", type=int, default=1, help="GPUs (or CPU processes) to shard the windows over")
    parser.add_argument("--csv", help="also write the table as CSV here")
    args = parser.parse_args(argv)
    if args.devices < 1:
        parser.error(f"--devices must be >= 1 (GPUs, or CPU processes, to shard the windows over), got {args.devices}")
    try:
        rows = evaluate_paths(args.runs, args.split, args.precision, args.devices)
    except (CheckpointError, PrecisionError) as err:
        print(f"resnorm-lm eval: error: {err}", file=sys.stderr)
        return 2
    if rank_zero_only.rank != 0:  # under --devices N the other ranks only helped count
        return 0
    notes = comparability_notes(text_groups(rows))
    if notes:
        print("\n".join(notes))
    for split in args.split:
        print(
            f"\n{split} (ranked by bits per byte within each evaluation text; every token of the split counted once)\n"
        )
        print(format_tables(rows, split))
    if args.csv:
        write_csv_atomic(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

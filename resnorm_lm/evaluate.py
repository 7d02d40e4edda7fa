"""``resnorm-lm eval``: perplexity, bits per byte and word-level perplexity of trained runs, as a table.

resnorm-lm eval runs/prenorm-12l/cpu-seed1 runs/postnorm-12l/cpu-seed1 [--split validation test]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from lightning.pytorch.utilities import rank_zero_only

from resnorm_lm.checkpoints import CheckpointError, LoadedRun, load_run
from resnorm_lm.data.cache import write_csv_atomic, write_json_atomic
from resnorm_lm.precision import AUTO, resolve_precision, uses_cuda
from resnorm_lm.trainer import Trainer

SPLITS = {"validation": ("validate", "val"), "test": ("test", "test")}


def evaluate_run(run: LoadedRun, splits: list[str], precision: str, devices: int, progress: bool = True) -> dict:
    """Every token of each split exactly once (non-overlapping windows, the tail included)."""
    trainer = Trainer(accelerator="auto", devices=devices, precision=precision, logger=False,
                        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=progress,
                        limit_val_batches=1.0, limit_test_batches=1.0)  # fmt: skip
    dm = run.datamodule
    dm.prepare_data()
    dm.setup()
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
    facts: dict[str, Any] = {"step": run.global_step, "params": sum(p.numel() for p in run.model.parameters())}
    if run.run_dir is None:
        return facts
    summary_path = run.run_dir / "eval.json"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        for key in ("tokens", "wall_s", "diverged", "diverged_reason", "recipe", "profile"):
            if key in summary:
                facts[key] = summary[key]
        if summary.get("tokens") and summary.get("wall_s"):
            facts["tokens_per_s"] = summary["tokens"] / summary["wall_s"]
    return facts


def identity(run: LoadedRun) -> tuple[str, str, int]:
    """What two runs must share for token-level perplexity to be comparable."""
    m = run.datamodule.manifest
    return m.tokenizer_sha256, m.corpus_fingerprint, run.datamodule.block_size


def format_table(rows: list[dict[str, Any]], split: str, comparable: bool) -> str:
    cols = ["run", "step", "params", "tokens", f"{split}_ppl", f"{split}_bpb", f"{split}_word_ppl", "tokens_per_s",
            "diverged"]  # fmt: skip
    if not comparable:
        cols.remove(f"{split}_ppl")
        cols.remove(f"{split}_word_ppl")
    rows = sorted(rows, key=lambda r: (bool(r.get("diverged")), r.get(f"{split}_bpb", math.inf)))

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4f}" if abs(value) < 100 else f"{value:.1f}"
        return "" if value is None else str(value)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def flatten(name: str, facts: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    row = {"run": name, **facts}
    for split, metrics in results.items():
        row.update({f"{split}_{k}": v for k, v in metrics.items()})
    return row


def evaluate_paths(paths: list[str], splits: list[str], precision: str = AUTO, devices: int = 1,
                   cache_dir: str | None = None, progress: bool = True) -> list[dict[str, Any]]:  # fmt: skip
    """Evaluate each run, merge the results into its eval.json, and return one flat row per run."""
    rows, identities = [], set()
    if precision == AUTO and rank_zero_only.rank == 0:
        print(f"resnorm-lm eval: {resolve_precision(AUTO, uses_cuda('auto')).describe()}", file=sys.stderr)
    for path in paths:
        run = load_run(path, cache_dir=cache_dir)
        if not progress:
            print(f"eval: {path}", flush=True)
        results = evaluate_run(run, splits, precision, devices, progress)
        identities.add(identity(run))
        facts = training_facts(run)
        row = flatten(str(run.run_dir or run.checkpoint), facts, results)
        rows.append(row)
        if run.run_dir is not None and rank_zero_only.rank == 0:
            summary_path = run.run_dir / "eval.json"
            summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
            earlier = summary.get("eval") or {}
            kept = earlier if earlier.get("step") == run.global_step else {}  # other splits of the same weights
            summary["eval"] = {**kept, "checkpoint": str(run.checkpoint), "step": run.global_step, **results}
            write_json_atomic(summary_path, summary)
    for row in rows:
        row["comparable"] = len(identities) == 1
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="resnorm-lm eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("runs", nargs="+", help="run directories (their last.ckpt) or .ckpt files")
    parser.add_argument("--split", nargs="+", choices=sorted(SPLITS), default=["validation", "test"])
    parser.add_argument("--precision", default=AUTO,
                        help="auto (default): bf16-mixed where this hardware runs bf16 fast, else 32-true on CPU "
                             "(16-mixed on GPUs without bf16); or any Lightning precision")  # fmt: skip
    parser.add_argument("--devices", type=int, default=1, help="GPUs (or CPU processes) to shard the windows over")
    parser.add_argument("--csv", help="also write the table as CSV here")
    args = parser.parse_args(argv)
    try:
        rows = evaluate_paths(args.runs, args.split, args.precision, args.devices)
    except CheckpointError as err:
        print(f"resnorm-lm eval: error: {err}", file=sys.stderr)
        return 2
    if rank_zero_only.rank != 0:  # under --devices N the other ranks only helped count
        return 0
    comparable = rows[0]["comparable"]
    if not comparable:
        print("note: these runs do not share one tokenizer, evaluation split and context; token-level perplexity "
              "is not comparable across them, so they are compared by bits per byte only.")  # fmt: skip
    for split in args.split:
        print(f"\n{split} (sorted by bits per byte; every token of the split counted once)\n")
        print(format_table(rows, split, comparable))
    if args.csv:
        write_csv_atomic(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What is done with one trained run: its perplexity (``resnorm-lm eval``), samples from it (``generate``) and
its weights out for other tools (``export``). Each loads the run through ``train.loaded_run.load_run``, which checks
the checkpoint and the data it was trained on before anything is read.

Each command's own description is its ``*_DESCRIPTION`` below (what ``resnorm-lm <command> --help`` prints).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, get_args

import torch
from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT_STR
from lightning.pytorch.utilities import rank_zero_only

from resnorm_lm.analysis.evidence import group_rows
from resnorm_lm.data.cache import atomic_write, write_csv_atomic, write_json_atomic
from resnorm_lm.data.tokenizer import EOT
from resnorm_lm.errors import ResnormError
from resnorm_lm.model import exported
from resnorm_lm.model.decoding import stream_text
from resnorm_lm.model.gpt import count_parameters
from resnorm_lm.train.lightning_module import data_identity
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

EVAL_DESCRIPTION = """
``resnorm-lm eval``: perplexity, bits per byte and word-level perplexity of trained runs, as tables.

resnorm-lm eval runs/prenorm-12l/cpu-seed1 runs/postnorm-12l/cpu-seed1 [--split validation test] [--precision run]

Each run is scored on the data it was trained on (refused, exit 2, when that data changed since) at the
precision it was trained with (``--precision 32-true`` for fp32, ``auto`` for this machine's fastest).
What the table compares: bits per byte and word-level perplexity only runs evaluated on the same text (the
same corpus fingerprint and split): one table per evaluation text, ranked within it. Token-level perplexity
also needs the same tokenizer; word-level perplexity does not (the words of one text are the same for every
tokenizer, and so is the probability a model gives the text).
"""

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


def eval_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="resnorm-lm eval", description=EVAL_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
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


GENERATE_DESCRIPTION = """
``resnorm-lm generate``: sample text from a trained run, streamed to stdout.

resnorm-lm generate runs/prenorm-12l/cpu-seed1 --prompt "ROMEO." --tokens 200 --temperature 0.8 --top_k 50
"""


def generate_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="resnorm-lm generate",
        description=GENERATE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", help="a run directory (its last.ckpt), a .ckpt file, or a resnorm-lm export folder")
    parser.add_argument("--prompt", default="", help="text to continue (default: start of a document)")
    parser.add_argument("--tokens", type=int, default=200, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top_k", type=int, default=50, help="0: no top-k cut")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--greedy", action="store_true", help="the most likely token each time (no sampling)")
    args = parser.parse_args(argv)
    if args.temperature <= 0 or args.tokens < 0 or args.top_k < 0:
        parser.error("--temperature must be > 0, --tokens and --top_k >= 0")
    try:
        run = load_run(args.run)  # refuses data that is not what the run trained on: its tokenizer must match
    except CheckpointError as err:
        print(f"resnorm-lm generate: error: {err}", file=sys.stderr)
        return 2
    dm = run.datamodule
    tokenizer = dm.prepared.tokenizer
    eot = dm.manifest.eot_id
    prompt_ids = [eot] + (tokenizer.encode(args.prompt).ids if args.prompt else [])
    generator = torch.Generator().manual_seed(args.seed)
    sys.stdout.write(args.prompt)
    for piece in stream_text(
        run.model.model,
        tokenizer,
        prompt_ids,
        args.tokens,
        args.temperature,
        args.top_k or None,
        generator,
        args.greedy,
    ):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


EXPORT_DESCRIPTION = """
``resnorm-lm export``: a trained run's weights out of its Lightning checkpoint, into a folder other tools read.

    resnorm-lm export runs/prenorm-12l/cpu-seed1 exports/prenorm-12l

The folder (``resnorm_lm/model/exported.py``): ``model.safetensors`` (weights only, no pickle), ``resnorm_lm.json``
(the model's config, the run, its data), the tokenizer (``tokenizer.json``, with a ``tokenizer_config.json`` that
``transformers.AutoTokenizer`` reads) and, for pre-norm and post-norm with LayerNorm, the ``config.json`` of
transformers' GPT-2 or OPT, so that ``AutoModelForCausalLM.from_pretrained(folder)`` gives this model's logits.
``resnorm-lm eval``, ``generate`` and ``fit --model.init_from=<folder>`` read it back without pickle.
"""


def tokenizer_files(tokenizer, block_size: int) -> dict[str, bytes]:
    """The tokenizer as transformers' fast tokenizer reads it: the ``tokenizers`` file as it is, and a config that
    names the class (without it transformers rebuilds a GPT-2 tokenizer from the vocabulary, dropping what the
    file says about normalizing and splitting) and the end-of-text token."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOT,
        "bos_token": EOT,
        "clean_up_tokenization_spaces": False,
        "model_max_length": block_size,
    }
    return {"tokenizer.json": tokenizer.to_str().encode(), "tokenizer_config.json": json.dumps(config).encode()}


def export(run_path: str, folder: Path) -> tuple[str, str]:
    """Write ``run_path``'s export into ``folder``; its layout and why."""
    run = load_run(run_path)  # the final weights, and the data (and tokenizer) the run trained on, checked
    gpt, dm = run.model.model, run.datamodule
    extra = {
        "run": {
            "source": str(run.checkpoint),
            "step": run.global_step,
            "precision": run.precision,
            "run_dir": str(run.run_dir) if run.run_dir else None,
        },
        "data": {k: v for k, v in dm.hparams.items() if not k.startswith("_")},
        "data_identity": data_identity(dm.manifest),
    }
    layout, files = exported.files(gpt, dm.manifest.eot_id, extra)
    files.update(tokenizer_files(dm.prepared.tokenizer, gpt.config.block_size))
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        with atomic_write(folder / name, "wb") as f:
            f.write(content)
    return layout, exported.layout_for(gpt.config)[1]


def export_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="resnorm-lm export", description=EXPORT_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", help="a run directory (its last.ckpt) or a .ckpt file")
    parser.add_argument("folder", help="where the export goes (made; an earlier export there is replaced)")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    if folder.is_file() or (folder.is_dir() and any(folder.iterdir()) and not exported.is_export(folder)):
        print(
            f"resnorm-lm export: error: {folder} exists and is not an export: choose an empty folder", file=sys.stderr
        )
        return 2
    try:
        layout, why = export(args.run, folder)
    except ResnormError as err:
        print(f"resnorm-lm export: error: {err}", file=sys.stderr)
        return 2
    print(f"resnorm-lm export: wrote {folder} ({layout} layout: {why})")
    if layout != "resnorm_lm":
        print(
            f"  transformers: AutoModelForCausalLM.from_pretrained({str(folder)!r}), "
            f"AutoTokenizer.from_pretrained({str(folder)!r})"
        )
    print(
        f"  resnorm-lm: resnorm-lm eval {folder}; resnorm-lm generate {folder}; "
        f"resnorm-lm fit ... --model.init_from={folder}"
    )
    return 0

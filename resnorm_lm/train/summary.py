"""The end of a training run: final validation, ``eval.json`` and the ``RESULT`` line."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import torch

from resnorm_lm.data.cache import write_json_atomic
from resnorm_lm.model.decoding import stream_text
from resnorm_lm.model.gpt import count_parameters
from resnorm_lm.train.runs import RunConfig, RunDir, result_line, tokens_seen


def finish_run(trainer: L.Trainer, model, datamodule, run: RunConfig, run_dir: Path, preempted: bool = False) -> dict:
    """Validate the final weights (unless that step was just validated), then record and print the result.

    After a SIGTERM the run only records where it stopped: the scheduler's grace period is short.
    """
    diverged = model.guard.diverged
    if not preempted and getattr(model, "last_validated_step", None) != trainer.global_step:
        trainer.validate(model, datamodule=datamodule, verbose=False)
    # a preempted run was not validated at its last step: no stale validation numbers in its summary
    metrics = {} if preempted else {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    summary = {
        "run": str(run_dir),
        "recipe": run.recipe,
        "profile": run.profile,
        "step": trainer.global_step,
        "finished": not preempted and (trainer.global_step >= trainer.max_steps or diverged is not None),
        "preempted": preempted,
        "val_loss": metrics.get("val/loss"),
        "val_ppl": metrics.get("val/ppl"),
        "val_bpb": metrics.get("val/bpb"),
        "val_word_ppl": metrics.get("val/word_ppl"),
        "val_targets": int(metrics.get("val/targets", 0)),
        "tokens": model.tokens_seen
        if model.tokens_seen is not None
        else tokens_seen(trainer, datamodule.batch_size, datamodule.block_size),
        "params": count_parameters(model),
        "wall_s": round(model.train_seconds(), 1),
        "diverged": diverged is not None or not math.isfinite(metrics.get("val/loss", 0.0)),
        "diverged_at_step": diverged["step"] if diverged else None,
        "diverged_reason": diverged["reason"] if diverged else None,
        "skipped_steps": model.guard.skipped,
        "clip": model.clips.summary(),  # how often clipping by norm bound; None: no clipping by norm counted
    }
    if trainer.is_global_zero:
        write_json_atomic(RunDir(run_dir).summary_path, summary)
        record_in_manifest(run_dir, summary)
        if summary["diverged"]:
            print(
                f"resnorm-lm: DIVERGED at step {summary['diverged_at_step']}: {summary['diverged_reason']}; "
                "the last good checkpoint is checkpoints/last.ckpt",
                flush=True,
            )
        print(result_line(summary), flush=True)
        if run.sample_tokens > 0 and not preempted:
            print_sample(model, datamodule, run.sample_tokens)
    return summary


def record_in_manifest(run_dir: Path, summary: dict) -> None:
    """The manifest says how the run ended too: finished, preempted or diverged (and why)."""
    manifest = RunDir(run_dir).manifest()
    keys = ("step", "finished", "preempted", "diverged", "diverged_at_step", "diverged_reason", "skipped_steps")
    manifest["ended"] = {k: summary[k] for k in keys}
    if manifest.get("segments"):
        manifest["segments"][-1]["ended"] = manifest["ended"]
    write_json_atomic(RunDir(run_dir).manifest_path, manifest)


def print_sample(model, datamodule, n_tokens: int, seed: int = 0) -> None:
    """A sample from the trained model, starting at an end-of-text token."""
    generator = torch.Generator(device=model.device).manual_seed(seed)
    pieces = stream_text(
        model.model, datamodule.prepared.tokenizer, [datamodule.manifest.eot_id], n_tokens, generator=generator
    )
    print("SAMPLE (temperature 0.8, top-k 50):\n" + "".join(pieces), flush=True)

"""What the depth-mixing designs learned to read: each reader's weights over the outputs before it.

AttnRes and Block AttnRes (``resnorm_lm/model/depth_attention.py``) read, at every sublayer and at the readout, a
softmax over depth ``a_i = softmax_i(w . RMSNorm(v_i))``: input-dependent, so measured here on the first
``--tokens`` targets of the validation split and averaged over those tokens. DenseFormer's depth-weighted averages
are plain parameters ``a_{i,j}`` (any sign, not normalized), read from the weights. At init AttnRes reads the
uniform average (``a_i = 1/N``) and DenseFormer its own block's output (``a_{i,i+1} = 1``), pre-norm's stream.

A weight alone does not say how much of a reader's input comes from a source: the values differ in size (an
AttnRes value is a sublayer's raw output). So each row also gives the **magnitude share** of each source,
``a_i * rms(v_i) / sum_j a_j * rms(v_j)`` (AttnRes; token-averaged weights and RMS over the same slice)::

    resnorm-lm depth-weights runs/suites/designs-12l/attnres-12l/cpu-lr0.004-wf0.25-seed0 --csv weights.csv

Per run and reader: the sources it reads, the weight (and share) on the embeddings and on the most recent source,
the source of the largest weight, and the effective number of sources ``exp(entropy)`` of the mean weights (N when
uniform, 1 when one source takes all).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from resnorm_lm.analysis.block_measurements import markdown_table, run_measurement_args, validation_slice
from resnorm_lm.data.cache import write_csv_atomic
from resnorm_lm.model.depth_attention import AttnRes, DenseFormer, DepthAttention
from resnorm_lm.model.gpt import GPT


@dataclass
class Reader:
    """One reader's weights over its sources, in depth order (the embeddings first)."""

    name: str  # "block 3 attention", "block 3 MLP", "readout", "after block 3"
    sources: list[str]  # "embeddings", "block 0 attention", ... or "depth-block 2"
    weights: list[float]  # mean over the tokens (softmax), or the parameters (DenseFormer)
    shares: list[float] | None  # a_i * rms(v_i), normalized to sum 1 (AttnRes only)

    def effective_sources(self) -> float:
        """exp of the entropy of the weights (softmax weights only: they are a distribution)."""
        return math.exp(-sum(w * math.log(w) for w in self.weights if w > 0))


def source_names(model: GPT) -> list[str]:
    """What an AttnRes value or Block AttnRes depth-block sum holds, in order: b_0 / v_0 is the embeddings."""
    first = model.stream.blocks[0]
    if type(first).max_blocks is None:  # full AttnRes: one value per sublayer
        sublayers = [f"block {l} {s}" for l in range(len(model.stream.blocks)) for s in ("attention", "MLP")]
        return ["embeddings", *sublayers]
    n_blocks = model.stream.blocks[-1].mlp_depth_block
    return ["embeddings"] + [f"depth-block {n}" for n in range(1, n_blocks + 1)]


def reader_names(model: GPT) -> dict[nn.Module, str]:
    """Every depth attention and its name, in depth order (the readout last)."""
    names = {}
    for l, block in enumerate(model.stream.blocks):
        if block.attn_res is not None:
            names[block.attn_res] = f"block {l} attention"
        names[block.mlp_res] = f"block {l} MLP"
    names[model.stream.readout] = "readout"
    return names


@torch.no_grad()
def attention_readers(model: GPT, x: torch.Tensor, batch_size: int = 64) -> list[Reader]:
    """Every depth attention's softmax weights and its sources' RMS, averaged over the tokens of ``x`` (N, T)."""
    names, labels = reader_names(model), source_names(model)
    sums: dict[nn.Module, list[torch.Tensor]] = {}  # reader -> [sum of a_i over tokens (S,), sum of rms_i (S,)]

    def hook(module: DepthAttention, args: tuple, output: torch.Tensor) -> None:
        values = args[0]
        a = module.weights(values).double()  # (S, B, T)
        rms = torch.stack([v.double().square().mean(-1).sqrt() for v in values])  # (S, B, T)
        got = sums.setdefault(module, [torch.zeros(len(values), dtype=torch.float64) for _ in range(2)])
        got[0] += a.sum((1, 2)).cpu()
        got[1] += rms.sum((1, 2)).cpu()

    handles = [m.register_forward_hook(hook) for m in names]
    try:
        for start in range(0, len(x), batch_size):
            model(x[start : start + batch_size])
    finally:
        for handle in handles:
            handle.remove()
    tokens = x.numel()
    readers = []
    for module, name in names.items():
        a, rms = (s / tokens for s in sums[module])  # (S,) each
        magnitude = a * rms
        readers.append(Reader(name, labels[: len(a)], a.tolist(), (magnitude / magnitude.sum()).tolist()))
    return readers


def dense_readers(model: GPT) -> list[Reader]:
    """DenseFormer's weights a_{i,j} after each block i, over X_0 (the embeddings) .. X_{i+1} (its own output)."""
    labels = ["embeddings"] + [f"block {l}" for l in range(len(model.stream.blocks))]
    return [
        Reader(f"after block {i}", labels[: i + 2], block.dwa.detach().double().tolist(), None)
        for i, block in enumerate(model.stream.blocks)
    ]


def readers_of(run_dir: Path, n_tokens: int) -> tuple[list[Reader], int]:
    """A finished run's readers at its final weights, and its step; ValueError when its design mixes no depth."""
    from resnorm_lm.train.loaded_run import load_run

    run = load_run(run_dir)
    model = run.model.model.eval()
    block = model.stream.blocks[0]
    if isinstance(block, DenseFormer):
        return dense_readers(model), run.global_step
    if not isinstance(block, AttnRes):
        raise ValueError(
            f"{run_dir}: its placement ({model.config.placement}) has no depth weights; depth-weights reads runs of "
            "attnres, attnres_block and denseformer"
        )
    x, _ = validation_slice(run.datamodule, n_tokens)
    return attention_readers(model, x, run.datamodule.eval_batch_size), run.global_step


def largest(reader: Reader) -> str:
    i = max(range(len(reader.weights)), key=lambda j: abs(reader.weights[j]))
    return f"{reader.sources[i]} ({reader.weights[i]:.2f})"


def summary_row(reader: Reader) -> dict[str, str]:
    row = {
        "reader": reader.name,
        "sources": str(len(reader.sources)),
        "on embeddings": f"{reader.weights[0]:.2f}",
        "on the most recent": f"{reader.weights[-1]:.2f}",
        "largest": largest(reader),
    }
    if reader.shares is not None:
        row["effective sources"] = f"{reader.effective_sources():.1f}"
        row["share: embeddings"] = f"{reader.shares[0]:.2f}"
        row["most recent"] = f"{reader.shares[-1]:.2f}"
    return row


def csv_rows(run_dir: Path, readers: list[Reader]) -> list[dict]:
    return [
        {
            "run": str(run_dir),
            "reader": r.name,
            "source": source,
            "weight": w,
            "magnitude_share": "" if r.shares is None else r.shares[i],
        }
        for r in readers
        for i, (source, w) in enumerate(zip(r.sources, r.weights))
    ]


def main(argv: list[str] | None = None) -> int:
    args = run_measurement_args(
        argv,
        "resnorm-lm depth-weights",
        "what AttnRes, Block AttnRes and DenseFormer runs learned to read: each reader's weights over the outputs "
        "before it, at the run's final weights",
        "run directories (each with checkpoints/last.ckpt)",
        "also write every reader's weight on every source to this CSV file",
    )
    rows = []
    for run_dir in args.runs:
        try:
            readers, step = readers_of(run_dir, args.tokens)
        except (ValueError, FileNotFoundError) as err:
            print(f"depth-weights: error: {err}", file=sys.stderr)
            return 2
        softmax = readers[0].shares is not None
        where = f"mean over {args.tokens:,} validation targets" if softmax else "its parameters"
        print(f"{run_dir} at step {step} ({where}):\n")
        print(markdown_table([summary_row(r) for r in readers]))
        rows += csv_rows(run_dir, readers)
    if args.csv:
        write_csv_atomic(args.csv, rows)
    return 0

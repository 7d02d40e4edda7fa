"""The attention logits of finished runs at their final weights: the quantity QK-norm is there to bound.

Dehghani et al. (2023, arXiv 2302.05442) saw ViT-22B diverge as its attention logits
``z_ij = <q_i, k_j> / sqrt(head_dim)`` grew until each softmax was nearly one-hot (its entropy near zero), and cured
it by normalising queries and keys; Wortsman et al. (2023, arXiv 2309.14322) reproduce the same "attention logit
growth" in small models trained at high learning rates, and the same cure. After an RMSNorm of
unit gain on each head's q and k, ``|z_ij| <= sqrt(head_dim)``; learned gains and a norm over all heads together
(OLMo 2's) move that bound but keep the logits from growing with the weights (each QK-norm's ``logit_cap`` gives
its bound at the run's gains). This command measures both quantities on a run's validation slice::

    resnorm-lm attention-logits runs/.../prenorm-12l/cpu-lr0.016-wf0.25-seed0 \
        runs/.../prenorm-12l-qknorm/cpu-lr0.016-wf0.25-seed0 --csv logits.csv

Per block: the largest ``|z_ij|`` over the heads, the query positions and the keys each may attend to (j <= i),
the mean over the query positions of each head's attention entropy in nats (row i has at most log(i + 1)), and the
lowest head's; and the block's cap, the largest ``|z_ij|`` its QK-norm allows at its gains (none without one). The
queries and keys are what the attention's QK-norm hands to the softmax (``qk_norm``'s output: the projections
themselves where the recipe has none), so the logits are the ones the model computed.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from resnorm_lm.analysis.block_measurements import markdown_table, run_measurement_args, validation_slice
from resnorm_lm.data.cache import write_csv_atomic
from resnorm_lm.model.gpt import GPT
from resnorm_lm.model.layers import CausalSelfAttention
from resnorm_lm.targets import IGNORE_INDEX
from resnorm_lm.train.diagnostics import causal_logits


@dataclass
class BlockLogits:
    """One attention's logits over a slice of windows."""

    max_abs_logit: float  # the largest |z_ij| over heads, counted query positions i and keys j <= i
    head_entropy: list[float]  # per head, the mean over counted query positions of the softmax's entropy (nats)
    cap: float = math.inf  # the largest |z_ij| the attention's QK-norm allows at its gains (inf: none)

    @property
    def mean_entropy(self) -> float:
        return sum(self.head_entropy) / len(self.head_entropy)

    @property
    def cap_cell(self) -> float | str:
        """The cap as a CSV cell: empty where there is none."""
        return self.cap if math.isfinite(self.cap) else ""


@dataclass
class StackLogits:
    """A model's ``BlockLogits`` across its blocks: what one row of a table says."""

    largest: float  # the largest |z_ij| of any block
    largest_block: int
    median_largest: float  # the median over the blocks of each one's largest
    mean_entropy: float  # over heads and blocks
    lowest_head: float  # the lowest head's mean entropy, of any block
    lowest_block: int
    median_of_cap: float | None  # the median over the blocks of each one's largest over its cap (None: no cap)


def across_blocks(blocks: list[BlockLogits]) -> StackLogits:
    top = max(range(len(blocks)), key=lambda b: blocks[b].max_abs_logit)
    low = min(range(len(blocks)), key=lambda b: min(blocks[b].head_entropy))
    return StackLogits(
        blocks[top].max_abs_logit,
        top,
        statistics.median(b.max_abs_logit for b in blocks),
        sum(b.mean_entropy for b in blocks) / len(blocks),
        min(blocks[low].head_entropy),
        low,
        statistics.median(b.max_abs_logit / b.cap for b in blocks)
        if all(math.isfinite(b.cap) for b in blocks)
        else None,
    )


def cap_text(stack: StackLogits) -> str:
    """The median fraction of the cap, or "-" where the attention has no QK-norm (no cap)."""
    return "-" if stack.median_of_cap is None else f"{stack.median_of_cap:.2f}"


@contextlib.contextmanager
def recorded_queries_keys(model: GPT) -> Iterator[dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """While open, each forward pass leaves in the yielded dict, per attention in the model's order, the queries
    and keys its softmax reads: its QK-norm's output, (B, T, C) each."""
    records: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    attentions = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]

    def keep(i: int):
        def record(module: torch.nn.Module, args: tuple, out: tuple[torch.Tensor, torch.Tensor]) -> None:
            records[i] = (out[0].detach(), out[1].detach())

        return record

    handles = [a.qk_norm.register_forward_hook(keep(i)) for i, a in enumerate(attentions)]
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()


def logits_and_entropy(
    q: torch.Tensor, k: torch.Tensor, n_head: int, counted: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Over queries ``q`` and keys ``k`` (B, T, C) and the query positions ``counted`` (B, T, bool): the largest
    causal ``|z_ij|`` (a 0-d tensor) and each head's entropy summed over the counted positions, (n_head,)."""
    z = causal_logits(q.double(), k.double(), n_head)  # (B, nh, T, T): row i a query, column j a key
    T = z.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=z.device).tril()  # (T, T): j <= i
    shown = causal & counted[:, None, :, None]  # (B, 1, T, T)
    largest = z.abs().masked_fill(~shown, 0.0).amax()
    p = z.masked_fill(~causal, float("-inf")).softmax(-1)  # (B, nh, T, T)
    entropy = torch.special.entr(p).sum(-1)  # (B, nh, T): -sum_j p log p, 0 where p = 0
    return largest, (entropy * counted[:, None, :]).sum((0, 2))


@torch.no_grad()
def measure(model: GPT, x: torch.Tensor, y: torch.Tensor, batch_size: int = 64) -> list[BlockLogits]:
    """Every attention's logits in ``model`` (in eval mode) on windows ``x`` (N, T); query positions whose target
    ``y`` (N, T) is IGNORE_INDEX (a last window's padding) are not counted."""
    n_head = model.config.n_head
    largest: list[torch.Tensor] = []  # per attention, 0-d
    entropy_sums: list[torch.Tensor] = []  # per attention, (n_head,)
    counted_positions = 0
    with recorded_queries_keys(model) as records:
        for start in range(0, len(x), batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]  # (B, T) each
            records.clear()
            model(xb)
            counted = yb != IGNORE_INDEX  # (B, T)
            counted_positions += int(counted.sum())
            stats = [logits_and_entropy(*records[i], n_head, counted) for i in range(len(records))]
            largest = [s[0] for s in stats] if not largest else [torch.maximum(a, s[0]) for a, s in zip(largest, stats)]
            sums = [s[1] for s in stats]
            entropy_sums = sums if not entropy_sums else [a + b for a, b in zip(entropy_sums, sums)]
    caps = [a.qk_norm.logit_cap() for a in model.modules() if isinstance(a, CausalSelfAttention)]
    return [
        BlockLogits(float(m), (e / counted_positions).tolist(), cap)
        for m, e, cap in zip(largest, entropy_sums, caps, strict=True)
    ]


def run_logits(run_dir: Path, n_tokens: int) -> tuple[list[BlockLogits], int, str]:
    """A finished run's per-attention logits at its final weights, its step and its QK-norm's name."""
    from resnorm_lm.train.loaded_run import load_run

    run = load_run(run_dir)  # weights_only: a checkpoint is data; its data checked and set up
    model = run.model.model.eval()
    x, y = validation_slice(run.datamodule, n_tokens)
    return measure(model, x, y, run.datamodule.eval_batch_size), run.global_step, model.config.qk_norm


def main(argv: list[str] | None = None) -> int:
    args = run_measurement_args(
        argv,
        "resnorm-lm attention-logits",
        "each attention's largest logit |q.k|/sqrt(head_dim) and its heads' entropy, in finished runs at their final "
        "weights (what QK-norm bounds)",
        "run directories (each with checkpoints/last.ckpt)",
        "also write every block's numbers to this CSV file",
    )
    rows, csv_rows = [], []
    for run_dir in args.runs:
        try:
            blocks, step, qk_norm = run_logits(run_dir, args.tokens)
        except (ValueError, FileNotFoundError) as err:
            print(f"attention-logits: error: {err}", file=sys.stderr)
            return 2
        stack = across_blocks(blocks)
        rows.append(
            {
                "run": str(run_dir),
                "qk_norm": qk_norm,
                "step": step,
                "largest logit (block)": f"{stack.largest:.3g} ({stack.largest_block})",
                "median over blocks of each one's largest": f"{stack.median_largest:.3g}",
                "mean entropy": f"{stack.mean_entropy:.3f}",
                "lowest head's (block)": f"{stack.lowest_head:.3f} ({stack.lowest_block})",
                "each block's largest over its cap: median": cap_text(stack),
            }
        )
        csv_rows += [
            {
                "run": str(run_dir),
                "step": step,
                "block": i,
                "max_abs_logit": b.max_abs_logit,
                "mean_entropy": b.mean_entropy,
                "lowest_head_entropy": min(b.head_entropy),
                "cap": b.cap_cell,
            }
            for i, b in enumerate(blocks)
        ]
    print(f"Attention logits on {args.tokens:,} validation targets, at each run's final weights (entropy in nats):\n")
    print(markdown_table(rows))
    if args.csv:
        write_csv_atomic(args.csv, csv_rows)
    return 0

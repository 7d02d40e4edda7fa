"""The composite gain of HC and mHC runs' stream mixes at their final weights, per token as mHC's paper measures it.

Training logs ``composite_gain`` (``hc/gain_forward``, ``hc/gain_backward`` in metrics.csv): every sublayer's
``H_res`` averaged over the batch's tokens, then composed, one cheap number per step. The mHC paper (arXiv
2512.24880, Fig. 3) composes each token's own ``H_res`` and averages the gain over the tokens of a sequence
afterwards (``token_composite_gain``). HC's ``H_res`` depends on the token (its dynamic part), so the two can
differ; this command measures both on the same validation targets, beside the last logged value::

    resnorm-lm stream-gain runs/suites/designs-24l/hc-24l/cpu-lr0.004-wf0.25-seed0 --csv gains.csv

Per run, forward / backward: the logged gain at its last step (of its last training batch), the token-mean
composite on the slice, the per-token composite's mean (the paper's number), median and largest value over the
slice's targets, and the paper's Fig. 3(b) peak: the composite from each sublayer l to the end, H_res[L-1] ...
H_res[l], per token and averaged over the targets, at the l where it is largest (the whole stack is l = 0).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from resnorm_lm.analysis.block_measurements import markdown_table, run_measurement_args, validation_slice
from resnorm_lm.analysis.stream_gain import gain_trace
from resnorm_lm.data.cache import write_csv_atomic
from resnorm_lm.model.gpt import GPT
from resnorm_lm.model.hyper_connections import (
    amax_gain,
    composed,
    recorded_mixes,
    token_gains_from_each_sublayer,
)
from resnorm_lm.targets import IGNORE_INDEX


@dataclass
class TokenGains:
    """One model's gains on a slice of windows; each a (forward, backward) pair."""

    tokens: int  # targets counted
    token_mean_mix: tuple[float, float]  # the composite of each sublayer's H_res averaged over the targets
    per_token_mean: tuple[float, float]  # the mean over the targets of each target's own composite's gain
    per_token_median: tuple[float, float]
    per_token_max: tuple[float, float]
    from_each_sublayer: list[tuple[float, float]]  # l = 0 .. L-1: the per-token mean of H_res[L-1] ... H_res[l]'s

    def peak(self, direction: int) -> tuple[float, int]:
        """The largest of ``from_each_sublayer`` in one direction (0 forward, 1 backward), and its l: the paper's
        Fig. 3(b) peak."""
        l = max(range(len(self.from_each_sublayer)), key=lambda k: self.from_each_sublayer[k][direction])
        return self.from_each_sublayer[l][direction], l


@torch.no_grad()
def measure(model: GPT, x: torch.Tensor, y: torch.Tensor, batch_size: int = 64) -> TokenGains:
    """Both gains of ``model`` (in eval mode) on windows ``x`` (N, T); targets ``y`` (N, T) equal to IGNORE_INDEX
    (a last window's padding) are not counted."""
    forward, backward = [], []  # per batch: (valid targets,) fp64
    sums: list[torch.Tensor] = []  # per sublayer: the sum over the valid targets of H_res, (n, n) fp64
    suffix_sums: list[torch.Tensor] = []  # per sublayer l: the sums over the valid targets of its suffix's gains (2,)
    with recorded_mixes(model) as mixes:
        for start in range(0, len(x), batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]  # (B, T) each
            mixes.clear()
            model(xb)
            valid = yb != IGNORE_INDEX  # (B, T)
            gains = token_gains_from_each_sublayer(mixes)  # per sublayer l, (B, T) each; l = 0 the whole stack
            forward.append(gains[0].forward[valid])
            backward.append(gains[0].backward[valid])
            batch_sums = [h_res[valid].double().sum(0) for h_res in mixes]  # per sublayer (n, n)
            sums = batch_sums if not sums else [a + b for a, b in zip(sums, batch_sums)]
            suffixes = [torch.stack([g.forward[valid].sum(), g.backward[valid].sum()]) for g in gains]  # (2,) each
            suffix_sums = suffixes if not suffix_sums else [a + b for a, b in zip(suffix_sums, suffixes)]
    fwd, bwd = torch.cat(forward), torch.cat(backward)  # (tokens,) each
    tokens = len(fwd)
    mean_mix = amax_gain(composed([s / tokens for s in sums]))

    def pair(f, b) -> tuple[float, float]:
        return float(f), float(b)

    return TokenGains(
        tokens,
        pair(*mean_mix),
        pair(fwd.mean(), bwd.mean()),
        pair(fwd.median(), bwd.median()),
        pair(fwd.max(), bwd.max()),
        [pair(*(s / tokens)) for s in suffix_sums],
    )


def run_gains(run_dir: Path, n_tokens: int) -> tuple[TokenGains, int, tuple[float, float] | None]:
    """A finished run's gains at its final weights, its step, and its last logged gain (None when it logs none);
    ValueError when its design has no stream mixes."""
    from resnorm_lm.train.loaded_run import load_run

    run = load_run(run_dir)
    model = run.model.model.eval()
    if model.config.placement not in ("hc", "mhc"):
        raise ValueError(
            f"{run_dir}: its placement ({model.config.placement}) has no stream mixes; stream-gain reads runs of hc "
            "and mhc"
        )
    x, y = validation_slice(run.datamodule, n_tokens)
    trace = gain_trace(run_dir)
    logged = (trace[-1][1], trace[-1][2]) if trace else None
    return measure(model, x, y, run.datamodule.eval_batch_size), run.global_step, logged


def both(pair: tuple[float, float] | None) -> str:
    return "-" if pair is None else f"{pair[0]:.4g} / {pair[1]:.4g}"


def sublayer_name(l: int) -> str:
    return f"block {l // 2} {('attention', 'MLP')[l % 2]}"


def peaks(gains: TokenGains) -> str:
    (f, lf), (b, lb) = gains.peak(0), gains.peak(1)
    return f"{f:.4g} / {b:.4g} (from {sublayer_name(lf)} / {sublayer_name(lb)})"


def main(argv: list[str] | None = None) -> int:
    args = run_measurement_args(
        argv,
        "resnorm-lm stream-gain",
        "HC and mHC runs' composite gain of the stream mixes at their final weights: per token, as the mHC paper "
        "measures it, beside the token-mean composite that training logs",
        "run directories (each with checkpoints/last.ckpt)",
        "also write each run's gains to this CSV file",
    )
    rows, csv_rows = [], []
    for run_dir in args.runs:
        try:
            gains, step, logged = run_gains(run_dir, args.tokens)
        except (ValueError, FileNotFoundError) as err:
            print(f"stream-gain: error: {err}", file=sys.stderr)
            return 2
        rows.append(
            {
                "run": str(run_dir),
                "step": step,
                "logged (last batch, token-mean mixes)": both(logged),
                "token-mean mixes": both(gains.token_mean_mix),
                "per token: mean (the paper's)": both(gains.per_token_mean),
                "median": both(gains.per_token_median),
                "max": both(gains.per_token_max),
                "per token, from each sublayer: peak mean (Fig. 3b)": peaks(gains),
            }
        )
        scalars = {k: v for k, v in asdict(gains).items() if k not in ("tokens", "from_each_sublayer")}
        flat = {f"{k}_{d}": v[i] for k, v in scalars.items() for i, d in enumerate("fb")}
        for i, d in enumerate("fb"):
            flat[f"peak_{d}"], l = gains.peak(i)
            flat[f"peak_{d}_from"] = sublayer_name(l)
        logged_flat = {"logged_f": logged[0], "logged_b": logged[1]} if logged else {"logged_f": "", "logged_b": ""}
        csv_rows.append({"run": str(run_dir), "step": step, "tokens": gains.tokens, **logged_flat, **flat})
    print(f"forward / backward gain, on {args.tokens:,} validation targets:\n")
    print(markdown_table(rows))
    if args.csv:
        write_csv_atomic(args.csv, csv_rows)
    return 0

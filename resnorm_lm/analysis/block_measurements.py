"""What each block of the stack does, measured three ways: at initialization (``resnorm-lm at-init``), in a
trained model (the loss when a block is skipped, its angular distance) and through training (the last block's
per-block metric over the first's, ``resnorm-lm block-ratio``).

## At initialization

Per block: the gradient norm of its weight matrices after one backward pass (Xiong et al. 2020, Fig. 3) and the
RMS of the residual stream it leaves (Sun et al. 2025, Fig. 1), the mean over seeds. One forward and backward
per (placement, init, depth, seed) on a fixed batch of random tokens, so 96 blocks fit on a laptop::

    python -m resnorm_lm at-init --depths 6 12 24 48 96 --inits gpt2 xavier --out results/at-init

Writes ``at_init.csv`` (a row per block), ``at_init.md`` (per placement, init and depth: the last block's
gradient norm over the first's, and the stream's RMS at the last block over the first's) and
``at_init_grad_norms.png``, ``at_init_stream_rms.png`` (a row per init, a column per depth, a line per
placement).

## Layer contribution (the curse-of-depth measurement)

For each block l, on a fixed slice of the validation split (its first ``n_tokens`` targets, in the run's
own non-overlapping windows):

- **the loss increase when the block is skipped**: the validation loss with block l's output replaced by
  its input, minus the loss of the whole model. The block leaves the stack with its norms and scalars (a
  post-norm block's stream then goes on un-renormalized). This is the "performance drop when a layer is
  removed" of LNS (Sun et al. 2025, "The Curse of Depth in Large Language Models", arXiv 2502.05795,
  section 2) and Mix-LN (Li et al. 2024, arXiv 2412.13795), with the validation loss as the performance.
- **the angular distance** between the block's input and output, ``(1/pi) * arccos(cos_sim(x_l, x_{l+1}))``
  per token, averaged over the tokens (Gromov et al. 2024, "The Unreasonable Ineffectiveness of the Deeper
  Layers", arXiv 2403.17887, the definition LNS and Mix-LN use). In [0, 1]: 0 when the block leaves the
  direction of every token's vector unchanged, as an identity block does.
- **the update's RMS**: the RMS over the tokens and channels of what the block adds to the stream, its output
  minus its input in the stream's ``residual`` tensor. Under pre-norm and its kin that is the sum of its
  sublayers' outputs, the "output magnitude" whose growth with depth AttnRes sets out to curb (Kimi Team 2026,
  arXiv 2603.15031: "more uniform output magnitudes ... across depth"); AttnRes's residual is the sum of its
  values, so its update is its sublayers' outputs v too. Under post-norm it is LN(x + F(x)) - x.

Placements with two streams (ResiDual: the post-norm stream x and the dual stream d): a skipped block
passes both on unchanged (it neither renormalizes x nor adds its sublayers' outputs to d), and the angular
distance is measured on x, the stream the next block's sublayers read.

``GPT`` and ``Block`` do not change for this: ``skipped`` shadows one block's ``forward`` for the length of
a ``with``, and the block inputs and outputs are read by forward hooks removed afterwards. A run's
measurement is cached in its directory (``layer_contribution.json``), so tables are re-rendered without
the checkpoint, as ``eval.json`` is. ``resnorm-lm layer-contribution RUN_DIR ...`` measures any finished runs
(a suite's, say) and prints, per run, how the update's RMS and the angular distance spread over the depth::

    resnorm-lm layer-contribution runs/suites/designs-12l/attnres-12l/cpu-lr0.004-wf0.25-seed* --csv blocks.csv

## The last block over the first, through training

Two metrics are logged per block in metrics.csv: the gradient norm of each block's matrices (``grad_norm``,
before clipping) and the RMS of the residual stream leaving each block (``stream_rms``).

- ``grad_norm``: a ratio far above 1 means the blocks near the input get almost no gradient (post-norm's vanishing
  gradient). At initialization it can be flat and still grow during the warmup (docs/depth.md, under Xavier's
  init at 24 blocks), which is why this reads the whole run and not only step 0.
- ``stream_rms``: how much the residual stream grows from the first block to the last (LayerNorm Scaling's
  Fig. 1), at initialization and once trained.

Per run: the ratio at the first logged step, its peak and the step of the peak, how many logged steps it spends
above ``--above``, the ratio at the last logged step, and at the end (the mean over the logged steps of the last
10% of the run, as the suite table's "Across depth"); a markdown table, and a CSV (written atomically) with ``--csv``.

    resnorm-lm block-ratio RUN_DIR [RUN_DIR ...] [--metric grad_norm|stream_rms] [--above 10]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from resnorm_lm.analysis.depth_balance import TAIL, TINY, at_end, ratio_trace
from resnorm_lm.data.cache import atomic_write, write_csv_atomic, write_json_atomic
from resnorm_lm.model.block import Stream
from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.init import INITS
from resnorm_lm.model.placements import PLACEMENTS
from resnorm_lm.targets import IGNORE_INDEX
from resnorm_lm.train.diagnostics import GRAD_NORMS, STREAM_RMS, StreamRMS, per_layer_grad_norms
from resnorm_lm.train.runs import RunDir


def measure_at_init(
    placement: str, init: str, n_layer: int, seed: int, width: int, batch: int, length: int, vocab: int
) -> tuple[list[float], list[float]]:
    """Per block (block 0 first): the gradient norm of its matrices and the stream's RMS after it, at init."""
    torch.manual_seed(seed)
    model = GPT(
        GPTConfig(
            vocab_size=vocab,
            block_size=length,
            n_layer=n_layer,
            n_head=max(1, width // 32),
            n_embd=width,
            placement=placement,
            init=init,
        )
    )
    tokens = torch.Generator().manual_seed(1000 + seed)
    idx = torch.randint(0, vocab, (batch, length + 1), generator=tokens)  # (B, T + 1)
    stream = StreamRMS(model)
    stream.active = True
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return per_layer_grad_norms(model), [v.item() for v in stream.take()]


def rows_for(placements: list[str], inits: list[str], depths: list[int], seeds: list[int], **shape) -> list[dict]:
    """A row per (placement, init, depth, block): the means over ``seeds``; progress on stderr."""
    rows, started = [], time.time()
    total, done = len(placements) * len(inits) * len(depths), 0
    for placement in placements:
        for init in inits:
            for depth in depths:
                runs = [measure_at_init(placement, init, depth, seed, **shape) for seed in seeds]
                for block in range(depth):
                    rows.append(
                        {
                            "placement": placement,
                            "init": init,
                            "n_layer": depth,
                            "block": block,
                            "grad_norm": statistics.mean(r[0][block] for r in runs),
                            "stream_rms": statistics.mean(r[1][block] for r in runs),
                        }
                    )
                done += 1
                print(
                    f"at-init: {done}/{total} {placement} {init} {depth} blocks ({time.time() - started:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per (placement, init, depth): the first and last block's values and their ratios."""
    out = []
    keys = sorted({(r["placement"], r["init"], r["n_layer"]) for r in rows}, key=lambda k: (k[0], k[1], k[2]))
    for placement, init, depth in keys:
        mine = [r for r in rows if (r["placement"], r["init"], r["n_layer"]) == (placement, init, depth)]
        first, last = mine[0], mine[-1]
        out.append(
            {
                "placement": placement,
                "init": init,
                "blocks": depth,
                "grad first": f"{first['grad_norm']:.3g}",
                "grad last": f"{last['grad_norm']:.3g}",
                "grad last/first": ratio(last["grad_norm"], first["grad_norm"]),
                "stream RMS first": f"{first['stream_rms']:.3g}",
                "stream RMS last": f"{last['stream_rms']:.3g}",
                "RMS last/first": ratio(last["stream_rms"], first["stream_rms"]),
            }
        )
    return out


def ratio(a: float, b: float) -> str:
    """a / b to two decimals; "-" where b is 0 (ReZero's blocks get no gradient while their gates are 0)."""
    return f"{a / b:.2f}" if b else "-"


def markdown_table(rows: list[dict]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(lines + ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]) + "\n"


def plot(rows: list[dict], key: str, ylabel: str, path: Path) -> Path:
    from matplotlib.ticker import MaxNLocator

    from resnorm_lm.analysis.plots import plt, recipe_colors, save_figure

    inits = sorted({r["init"] for r in rows})
    depths = sorted({r["n_layer"] for r in rows})
    fig, axes = plt.subplots(
        len(inits), len(depths), figsize=(3.6 * len(depths), 3.2 * len(inits)), dpi=90, squeeze=False, sharey="row"
    )
    colors = recipe_colors(r["placement"] for r in rows)
    for i, init in enumerate(inits):
        for j, depth in enumerate(depths):
            ax = axes[i][j]
            for placement in sorted({r["placement"] for r in rows}):
                mine = [r for r in rows if (r["placement"], r["init"], r["n_layer"]) == (placement, init, depth)]
                ax.plot(
                    [r["block"] for r in mine], [r[key] for r in mine], color=colors[placement], lw=1, label=placement
                )
            ax.set(title=f"{init} init, {depth} blocks", yscale="log", xlabel="block (0: input side)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if j == 0:
                ax.set_ylabel(ylabel)
    flat = list(axes.flat)
    return save_figure(fig, flat, flat[:1], path)


def write_outputs(rows: list[dict], out: Path, command: str, args: argparse.Namespace) -> None:
    """at_init.csv, at_init.md and the two figures, under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(out / "at_init.csv", rows)
    with atomic_write(out / "at_init.md", "w") as f:
        f.write(
            f"# Every placement at initialization\n\n`{command}`\n\n"
            f"Width {args.width}, {args.batch} x {args.length} random tokens of {args.vocab}, mean of seeds "
            f"{', '.join(map(str, args.seeds))}. Gradient norm: of each block's weight matrices after one "
            "backward pass; stream RMS: of the residual stream leaving each block (ResiDual: its dual "
            "stream).\n\n"
        )
        f.write(markdown_table(summary(rows)))
    plot(rows, "grad_norm", "||grad W|| of the block", out / "at_init_grad_norms.png")
    plot(rows, "stream_rms", "stream RMS after the block", out / "at_init_stream_rms.png")


def at_init_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="resnorm-lm at-init",
        description="every placement at initialization, over depths and inits, without training",
    )
    parser.add_argument("--placements", nargs="+", default=PLACEMENTS.names(), choices=PLACEMENTS.names())
    parser.add_argument("--inits", nargs="+", default=["gpt2", "xavier"], choices=INITS.names())
    parser.add_argument("--depths", nargs="+", type=int, default=[6, 12, 24, 48, 96])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--width", type=int, default=128, help="n_embd (the cpu profile's; heads of width 32)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--out", type=Path, default=Path("results/at-init"))
    args = parser.parse_args(argv)
    if any(d < 1 for d in args.depths) or args.width < 1 or args.batch < 1 or args.length < 1:
        parser.error("depths, width, batch and length must be positive")
    rows = rows_for(
        args.placements,
        args.inits,
        args.depths,
        args.seeds,
        width=args.width,
        batch=args.batch,
        length=args.length,
        vocab=args.vocab,
    )
    command = "python -m resnorm_lm at-init " + " ".join(argv if argv is not None else sys.argv[1:])
    write_outputs(rows, args.out, command.strip(), args)
    print(f"at-init: wrote at_init.csv, at_init.md and two figures to {args.out}")
    return 0


CACHE_FILE = "layer_contribution.json"
DEFAULT_TOKENS = 16_384  # 128 windows of the cpu profile's context 128: 12% of its validation split


@contextmanager
def skipped(block: nn.Module) -> Iterator[None]:
    """Inside the ``with``, ``block`` returns the stream it is given (one tensor, or ResiDual's pair)."""
    block.forward = _pass_through  # an instance attribute shadows the class's forward for this block only
    try:
        yield
    finally:
        del block.forward


def _pass_through(stream: Stream) -> Stream:
    return stream


def angular_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(1/pi) * arccos(cos_sim(a, b))`` along the last dimension: (..., C) x (..., C) -> (...), in [0, 1].

    In fp64: near cos = 1 the arccos magnifies rounding (arccos(1 - e) ~ sqrt(2e)), and fp32 would put an
    identity block at about 1e-4 instead of 0."""
    cos = F.cosine_similarity(a.double(), b.double(), dim=-1)
    return torch.arccos(cos.clamp(-1.0, 1.0)) / math.pi


@dataclass
class LayerContribution:
    """One model's measurement: block 0 (input side) first."""

    tokens: int  # targets counted
    loss: float  # mean cross-entropy of the whole model on the slice (nats/token)
    skipped_loss: list[float]  # the same with block l skipped
    angular_distance: list[float]  # mean over the tokens of the angular distance of block l's input and output
    update_rms: list[float]  # RMS over the tokens and channels of what block l adds to the stream (output - input)

    @property
    def loss_increase(self) -> list[float]:
        return [skipped - self.loss for skipped in self.skipped_loss]


@torch.no_grad()
def measure(model: GPT, x: torch.Tensor, y: torch.Tensor, batch_size: int = 64) -> LayerContribution:
    """The three measurements for every block of ``model`` (in eval mode) on windows ``x`` (N, T) with targets
    ``y`` (N, T); targets equal to IGNORE_INDEX (a last window's padding) are not tokens."""
    distances = torch.zeros(len(model.blocks), dtype=torch.float64, device=x.device)  # (L,): sums over tokens
    squares = torch.zeros_like(distances)  # (L,): sums over tokens of the update's mean square over channels
    valid: list[torch.Tensor] = []  # the current batch's (B, T) mask, read by the hooks
    block_input = model.stream.block_input  # the (B, T, C) tensor a block's sublayers read from the stream
    residual = model.stream.residual  # the (B, T, C) tensor that holds the sum of the blocks' outputs

    def recorder(layer: int):
        def hook(module: nn.Module, args: tuple, output: Stream) -> None:
            d = angular_distance(block_input(args[0]), block_input(output))  # (B, T)
            distances[layer] += d[valid[0]].sum()
            update = residual(output).double() - residual(args[0]).double()  # (B, T, C)
            squares[layer] += update.square().mean(-1)[valid[0]].sum()

        return hook

    handles = [block.register_forward_hook(recorder(i)) for i, block in enumerate(model.blocks)]
    try:
        loss, tokens = slice_loss(model, x, y, batch_size, valid)
    finally:
        for handle in handles:
            handle.remove()
    skipped_losses = []
    for block in model.blocks:
        with skipped(block):
            skipped_losses.append(slice_loss(model, x, y, batch_size)[0])
    return LayerContribution(
        tokens, loss, skipped_losses, (distances / tokens).tolist(), (squares / tokens).sqrt().tolist()
    )


def slice_loss(
    model: GPT, x: torch.Tensor, y: torch.Tensor, batch_size: int, valid: list[torch.Tensor] | None = None
) -> tuple[float, int]:
    """Mean cross-entropy over the targets of ``y`` (N, T) and their number; ``valid`` is set to each
    batch's target mask before its forward pass."""
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, len(x), batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]  # (B, T) each
        if valid is not None:
            valid[:] = [yb != IGNORE_INDEX]
        total += model(xb, yb, reduction="sum")[1].double()  # targets equal to IGNORE_INDEX count for nothing
    tokens = int((y != IGNORE_INDEX).sum())
    return total.item() / max(tokens, 1), tokens


def run_measurement_args(argv: list[str] | None, prog: str, description: str, runs_help: str, csv_help: str):
    """The arguments of a command that measures finished runs at their final weights on the validation split's first
    targets: the run directories, ``--tokens`` (positive) and ``--csv``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("runs", nargs="+", type=Path, help=runs_help)
    parser.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help="validation targets measured on")
    parser.add_argument("--csv", type=Path, help=csv_help)
    args = parser.parse_args(argv)
    if args.tokens < 1:
        parser.error(f"--tokens must be positive, got {args.tokens}")
    return args


def validation_slice(datamodule, n_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``ceil(n_tokens / T)`` windows of the validation split (all of it when shorter), as the
    evaluation reads them: inputs and targets, (N, T) each."""
    windows = datamodule.eval_windows("validation")
    n = min(len(windows), max(1, math.ceil(n_tokens / datamodule.block_size)))
    pairs = [windows[i] for i in range(n)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def run_contribution(run_dir: Path, n_tokens: int = DEFAULT_TOKENS) -> dict | None:
    """A finished run's measurement at its final weights: from its cache when it was measured at the run's
    last step on the same slice, else from ``checkpoints/last.ckpt`` (cached then); None without either."""
    from resnorm_lm.train.loaded_run import load_run

    run_files = RunDir(run_dir)
    cache = run_files.path / CACHE_FILE
    if cache.is_file():
        cached = json.loads(cache.read_text())
        same = cached.get("step") == run_files.summary().get("step") and cached.get("tokens_asked") == n_tokens
        if same and ("update_rms" in cached or not run_files.has_checkpoint()):
            return cached  # one measured before update_rms was: measured again where the weights are here
    if not run_files.has_checkpoint():
        return None
    run = load_run(run_files.path)  # weights_only: a checkpoint is data; its data checked and set up
    dm = run.datamodule
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = run.model.model.to(device).eval()
    x, y = validation_slice(dm, n_tokens)
    result = measure(model, x.to(device), y.to(device), dm.eval_batch_size)
    record = {
        "step": run.global_step,
        "tokens_asked": n_tokens,
        "device": device,
        **asdict(result),
        "loss_increase": result.loss_increase,
    }
    write_json_atomic(cache, record)
    return record


def block_means(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """The blocks of one (recipe, depth)'s layer_contribution rows, and ``key``'s mean over seeds at each."""
    layers = sorted({r["layer"] for r in rows})
    return layers, [statistics.fmean(r[key] for r in rows if r["layer"] == layer) for layer in layers]


METRICS = {"grad_norm": GRAD_NORMS, "stream_rms": STREAM_RMS}


@dataclass(frozen=True)
class BlockRatio:
    """One run's last-over-first ratio of a per-block metric over its logged steps."""

    run: Path
    first: float  # at the first logged step
    peak: float
    peak_step: int
    steps_above: int  # logged steps whose ratio exceeds the threshold
    logged_steps: int
    last: float  # at the last logged step
    end: float  # the mean over the logged steps of the run's last TAIL (the suite table's "at the end")

    @classmethod
    def of(cls, run_dir: Path, metric: str, above: float) -> BlockRatio:
        prefix = METRICS[metric]
        if not RunDir(run_dir).metrics_path.is_file():
            raise ValueError(f"{run_dir}: no metrics.csv there; give run directories (runs/<recipe>/<run>)")
        ratios = ratio_trace(run_dir, prefix)  # (step, last block's value / first block's)
        if not ratios:
            raise ValueError(f"{run_dir}: metrics.csv logs no per-block {metric} ({prefix}XX)")
        peak_step, peak = max(ratios, key=lambda r: r[1])
        above_count = sum(ratio > above for _, ratio in ratios)
        return cls(run_dir, ratios[0][1], peak, peak_step, above_count, len(ratios), ratios[-1][1], at_end(ratios))


def table(ratios: list[BlockRatio], metric: str, above: float) -> str:
    lines = [
        f"{metric}, last block over first:",
        "",
        f"| run | first logged step | peak (step) | logged steps above {above:g} | last logged step | "
        f"at the end (mean over the last {TAIL:.0%} of steps) |",
        "|---|---|---|---|---|---|",
    ]
    for r in ratios:
        lines.append(
            f"| {r.run} | {r.first:.2f} | {r.peak:.2f} ({r.peak_step}) | {r.steps_above} of "
            f"{r.logged_steps} | {r.last:.2f} | {r.end:.2f} |"
        )
    return "\n".join(lines)


def write_csv(ratios: list[BlockRatio], metric: str, path: Path) -> None:
    write_csv_atomic(path, [{"metric": metric, **asdict(r)} for r in ratios])


def block_ratio_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="resnorm-lm block-ratio",
        description="The last block's value of a per-block metric over the first's at every logged step of each run.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with its metrics.csv)")
    parser.add_argument("--metric", choices=sorted(METRICS), default="grad_norm")
    parser.add_argument("--above", type=float, default=10.0, help="count the logged steps whose ratio exceeds this")
    parser.add_argument("--csv", type=Path, help="also write the rows to this CSV file")
    args = parser.parse_args(argv)
    try:
        ratios = [BlockRatio.of(run, args.metric, args.above) for run in args.runs]
    except ValueError as err:
        print(f"block_ratio: error: {err}", file=sys.stderr)
        return 2
    print(table(ratios, args.metric, args.above))
    if args.csv:
        write_csv(ratios, args.metric, args.csv)
    return 0


def contribution_summary(run_dir: Path, record: dict) -> dict:
    """One run's layer contribution over the depth: the update's RMS at the first and last block, last over
    first, the largest over the smallest (1: every block adds as much), and the angular distance's mean over
    the first and last quarter of the blocks."""
    update, angle = record["update_rms"], record["angular_distance"]
    q = math.ceil(len(angle) / 4)
    return {
        "run": str(run_dir),
        "loss": record["loss"],
        "update_first": update[0],
        "update_last": update[-1],
        "update_last_over_first": update[-1] / max(update[0], TINY),
        "update_max_over_min": max(update) / max(min(update), TINY),
        "angle_first_quarter": statistics.fmean(angle[:q]),
        "angle_last_quarter": statistics.fmean(angle[-q:]),
    }


def layer_contribution_main(argv: list[str] | None = None) -> int:
    args = run_measurement_args(
        argv,
        "resnorm-lm layer-contribution",
        "each block's update RMS, angular distance and loss when skipped, in finished runs at their final weights "
        "(cached in each run as layer_contribution.json)",
        "run directories (with checkpoints/last.ckpt or a cache)",
        "also write every block's numbers to this CSV file",
    )
    summaries, blocks = [], []
    for run_dir in args.runs:
        record = run_contribution(run_dir, args.tokens)
        if record is None or "update_rms" not in record:
            why = f"no checkpoints/last.ckpt to measure, and no {CACHE_FILE} with update_rms for {args.tokens} tokens"
            print(f"layer-contribution: error: {run_dir}: {why}", file=sys.stderr)
            return 2
        summaries.append(contribution_summary(run_dir, record))
        per_block = zip(record["loss_increase"], record["angular_distance"], record["update_rms"])
        blocks += [
            {"run": str(run_dir), "block": i, "loss_increase": d, "angular_distance": a, "update_rms": u}
            for i, (d, a, u) in enumerate(per_block)
        ]
    print(f"Layer contribution on {args.tokens:,} validation targets, at each run's final weights:\n")
    rows = [
        {
            "run": s["run"],
            "loss": f"{s['loss']:.3f}",
            "update RMS, first block": f"{s['update_first']:.3g}",
            "last block": f"{s['update_last']:.3g}",
            "last / first": f"{s['update_last_over_first']:.2f}",
            "largest / smallest": f"{s['update_max_over_min']:.2f}",
            "angle, first quarter": f"{s['angle_first_quarter']:.3f}",
            "last quarter": f"{s['angle_last_quarter']:.3f}",
        }
        for s in summaries
    ]
    print(markdown_table(rows))
    if args.csv:
        write_csv_atomic(args.csv, blocks)
    return 0

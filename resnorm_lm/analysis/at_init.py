"""``resnorm-lm at-init``: every placement at initialization, over depths and inits, without training.

Per block: the gradient norm of its weight matrices after one backward pass (Xiong et al. 2020, Fig. 3) and the
RMS of the residual stream it leaves (Sun et al. 2025, Fig. 1), the mean over seeds. One forward and backward
per (placement, init, depth, seed) on a fixed batch of random tokens, so 96 blocks fit on a laptop::

    python -m resnorm_lm at-init --depths 6 12 24 48 96 --inits gpt2 xavier --out results/at-init

Writes ``at_init.csv`` (a row per block), ``at_init.md`` (per placement, init and depth: the last block's
gradient norm over the first's, and the stream's RMS at the last block over the first's) and
``at_init_grad_norms.png``, ``at_init_stream_rms.png`` (a row per init, a column per depth, a line per
placement).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from resnorm_lm.data.cache import atomic_write, write_csv_atomic
from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.init import INITS
from resnorm_lm.model.placements import PLACEMENTS
from resnorm_lm.train.diagnostics import StreamRMS, per_layer_grad_norms


def measure(
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
                runs = [measure(placement, init, depth, seed, **shape) for seed in seeds]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="resnorm-lm at-init", description=__doc__.split("\n\n")[0])
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


if __name__ == "__main__":
    sys.exit(main())

"""Where DyT stops learning here: the residual stream entering the readout (the final norm), and how much of
the readout's tanh it saturates, in trained runs (their last checkpoint).

    .venv/bin/python docs/results/cpu-norms/dyt_readout.py \
        --tokens ~/.cache/resnorm-lm/prepared/shakespeare-<key>/validation.bin RUN_DIR [RUN_DIR ...]

RUN_DIR: a run directory with checkpoints/last.ckpt (runs/<recipe>/<profile>-lr...-seedK). The tokens: the
prepared validation split the runs trained beside (uint16). Prints, per run, the RMS of the final norm's input
on 16 windows of 128 tokens, split into its mean over the tokens (what every token shares) and the rest, the
readout's alpha, and the share of elements with |alpha x| > 2 (where tanh' < 0.08: no gradient passes back to
the blocks).
"""

import argparse

import numpy as np
import torch

from resnorm_lm.train.loaded_run import load_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", required=True, help="a prepared split's .bin (uint16 token ids)")
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    data = np.memmap(args.tokens, dtype=np.uint16, mode="r")
    idx = torch.from_numpy(np.stack([data[i : i + 128].astype(np.int64) for i in range(0, 16 * 128, 128)]))
    for run_dir in args.runs:
        model = load_run(run_dir).model.model
        readout = model.stream.final_norm
        seen = {}
        readout.register_forward_pre_hook(lambda m, a, seen=seen: seen.setdefault("x", a[0]))  # (B, T, C)
        with torch.no_grad():
            model(idx)
        x = seen["x"].float()
        mean = x.mean(dim=(0, 1))  # (C,)
        alpha = getattr(readout, "alpha", None)
        share = f"{(alpha * x).abs().gt(2).float().mean().item():.3f}" if alpha is not None else "- (no tanh)"
        alpha = f"{alpha.item():.3f}" if alpha is not None else "-"
        print(
            f"{run_dir}: readout input RMS {x.pow(2).mean().sqrt().item():.2f} (token mean "
            f"{mean.pow(2).mean().sqrt().item():.2f}, the rest {(x - mean).pow(2).mean().sqrt().item():.2f}); "
            f"readout alpha {alpha}; |alpha x| > 2: {share}"
        )


if __name__ == "__main__":
    main()

"""Does pre-norm's attention show the logit growth that QK-norm is there to stop, at this scale?

Wortsman et al. (2023, arXiv 2309.14322) reproduce in small models the instability Dehghani et al. (2023, arXiv
2302.05442) met in ViT-22B: at high learning rates the attention logits ``q.k / sqrt(head_dim)`` grow until each
softmax is nearly one-hot, and QK-norm prevents it. The suites keep no checkpoints, so this probe trains again, from
their committed configs, the selection seed's runs of pre-norm (suite ``placements-12l``) and of pre-norm with
OLMo 2's QK-norm (``prenorm-12l-qknorm``, suite ``designs-12l``) and with QK-norm per head (``-qknorm-head``) at a
few settings of their grids, each exactly as the suite trained it (its config, the portable arithmetic: the same
losses to the last digit on a machine of the suite's arithmetic, which the table checks), and measures each at its
final weights with ``resnorm-lm attention-logits``::

    python scripts/qk_attention_logits.py train [--root runs/qk-logits] [--reuse runs/suites/designs-12l] [--jobs 1]
    python scripts/qk_attention_logits.py table [--root runs/qk-logits] [--reuse ...] [--export docs/results/qk-logits]

``--reuse``: roots laid out as the suite's (``<root>/<recipe>/<run>``) whose finished runs with a checkpoint are
measured instead of trained again (a suite's own worktree keeps them). One seed per setting: a mechanism measured
beside the suite's table, not a row of it.
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path

from resnorm_lm.analysis.attention_logits import across_blocks, cap_text, run_logits
from resnorm_lm.analysis.block_measurements import DEFAULT_TOKENS, markdown_table
from resnorm_lm.analysis.launchers import refit_command, train_probe_runs
from resnorm_lm.data.cache import atomic_write, write_csv_atomic
from resnorm_lm.train.arithmetic import PORTABLE_ENV
from resnorm_lm.train.runs import RunDir, copy_small_files

REPO = Path(__file__).resolve().parents[1]
SUITES = REPO / "docs/results/suites"
RECIPES = {  # recipe: the committed suite whose seed-0 runs are trained again
    "prenorm-12l": SUITES / "placements-12l/run-files",
    "prenorm-12l-qknorm": SUITES / "designs-12l/run-files",
    "prenorm-12l-qknorm-head": SUITES / "designs-12l/run-files",
}
SETTINGS = [("0.004", "0.25"), ("0.008", "0.25"), ("0.016", "0.25"), ("0.016", "0.5")]  # (lr, warmup fraction)
TOKENS = DEFAULT_TOKENS  # validation targets measured on: attention-logits' default


def run_name(lr: str, warmup: str) -> str:
    return f"cpu-lr{lr}-wf{warmup}-seed0"


def committed_run(recipe: str, lr: str, warmup: str) -> Path:
    return RECIPES[recipe] / recipe / run_name(lr, warmup)


def probe_run(recipe: str, lr: str, warmup: str, root: Path) -> Path:
    return root / recipe / run_name(lr, warmup)


def measurable(run: Path) -> bool:
    files = RunDir(run)
    return files.state() == "finished" and files.has_checkpoint()


def found_run(recipe: str, lr: str, warmup: str, root: Path, reuse: list[Path]) -> Path | None:
    """The first finished run with a checkpoint for the setting: in ``root``, then in each ``reuse`` root."""
    for base in (root, *reuse):
        if measurable(run := probe_run(recipe, lr, warmup, base)):
            return run
    return None


def fit_command(recipe: str, lr: str, warmup: str, root: Path, resume: bool) -> list[str]:
    """The committed seed-0 run's own config, written under ``root``."""
    return refit_command(committed_run(recipe, lr, warmup) / "config.yaml", root, f"lr{lr}-wf{warmup}", resume)


def train(root: Path, reuse: list[Path], jobs: int) -> int:
    runs = [
        (probe_run(recipe, lr, warmup, root), functools.partial(fit_command, recipe, lr, warmup, root))
        for recipe in RECIPES
        for lr, warmup in SETTINGS
        if found_run(recipe, lr, warmup, root, reuse) is None  # an interrupted one in root is resumed
    ]
    return train_probe_runs(runs, {**os.environ, **PORTABLE_ENV}, jobs, "qk attention logits")


def table(root: Path, reuse: list[Path], export: Path | None) -> int:
    rows, per_block, measured = [], [], []
    for recipe in RECIPES:
        for lr, warmup in SETTINGS:
            run = found_run(recipe, lr, warmup, root, reuse)
            if run is None:
                print(f"qk attention logits: {recipe} at {lr}/{warmup}: no finished run with a checkpoint yet")
                continue
            blocks, _, qk_norm = run_logits(run, TOKENS)
            loss, committed = RunDir(run).summary().get("val_loss"), RunDir(committed_run(recipe, lr, warmup))
            stack = across_blocks(blocks)
            rows.append(
                {
                    "recipe": f"`{recipe}`",
                    "QK-norm": qk_norm,
                    "lr": lr,
                    "warmup": warmup,
                    "val loss": f"{loss:.3f}",
                    "the committed run's, to the last digit": "yes"
                    if committed.summary().get("val_loss") == loss
                    else "no",
                    "largest logit (block)": f"{stack.largest:.3g} ({stack.largest_block})",
                    "each block's largest: median": f"{stack.median_largest:.3g}",
                    "attention entropy (nats): mean": f"{stack.mean_entropy:.2f}",
                    "lowest head (block)": f"{stack.lowest_head:.3f} ({stack.lowest_block})",
                    "each block's largest over its cap: median": cap_text(stack),
                }
            )
            per_block += [
                {"recipe": recipe, "lr": lr, "warmup": warmup, "block": i, "max_abs_logit": b.max_abs_logit}
                | {"cap": b.cap_cell}
                | {f"entropy_head_{h}": e for h, e in enumerate(b.head_entropy)}
                for i, b in enumerate(blocks)
            ]
            if run.is_relative_to(root):
                measured.append(run)
    text = (
        f"Seed 0, each run at its final weights (step 500), on the first {TOKENS:,} validation targets: the largest "
        "attention logit |q.k|/sqrt(head_dim) over heads, positions and blocks, and the median over the 12 blocks of "
        "each one's largest; each head's attention entropy averaged over query positions (nats; a row of i + 1 keys "
        "has at most log(i + 1)), the mean over heads and blocks and the lowest head's; and where there is QK-norm, "
        "each block's largest logit over its cap (the largest its QK-norm allows at the run's gains, "
        "`logit_cap`), the median over the blocks.\n\n" + markdown_table(rows) + "\n"
    )
    print(text)
    if export is not None and rows:
        copy_small_files(measured, root, export / "run-files")
        machines = sorted({RunDir(run).manifest()["hardware"]["cpu"] for run in measured})
        write_csv_atomic(export / "blocks.csv", per_block)
        with atomic_write(export / "qk-logits.md", "w") as f:
            f.write(
                f"# Attention logits of pre-norm with and without QK-norm ({', '.join(machines) or 'the suite'}, "
                "portable arithmetic)\n\n`python scripts/qk_attention_logits.py train`, then `table --export "
                "docs/results/qk-logits` (scripts/qk_attention_logits.py says why); every block's numbers: "
                "[blocks.csv](blocks.csv); the runs trained again: `run-files/`.\n\n" + text
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["train", "table"])
    parser.add_argument("--root", type=Path, default=Path("runs/qk-logits"))
    parser.add_argument("--reuse", type=Path, action="append", default=[], help="a suite's runs root to measure from")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--export", type=Path, help="table: also write the table, blocks.csv and the runs' small files")
    args = parser.parse_args(argv)
    root, reuse = args.root.resolve(), [r.resolve() for r in args.reuse]
    return train(root, reuse, args.jobs) if args.what == "train" else table(root, reuse, args.export)


if __name__ == "__main__":
    raise SystemExit(main())

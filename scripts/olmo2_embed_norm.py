"""How much of OLMo 2's gap to pre-norm is the embeddings' scale?

In the suite ``designs-12l`` OLMo 2's reordered norm (``olmo2-12l``: ``x + RMSNorm(F(x))``, QK-norm over all heads)
ends 0.26 nats behind pre-norm, each at its pick. Its sublayers read the raw stream, which starts at the embeddings'
RMS (0.028 under GPT-2's init) while each normed sublayer output added to it is as large as its norm's gain.
Sandwich, the other placement with a norm on each sublayer's output, closed most of the same gap when its
embeddings were normed (Peri-LN's option, ``sandwich-12l-paper``). This probe trains OLMo 2's block on embeddings
normed the same way (placement ``olmo2_embed_norm``) at OLMo 2's pick, 8e-3 with half the run warming up, at the
suite's fresh seeds: each run is that setting's committed seed-0 config of ``olmo2-12l`` with the placement and the
seed changed, as the suite's seed-N runs are, in the suite's portable arithmetic.

    python scripts/olmo2_embed_norm.py train [--seeds 1 2 3 4 5] [--jobs 1] [--root runs/olmo2-embed-norm]
    python scripts/olmo2_embed_norm.py table [--root runs/olmo2-embed-norm] [--export docs/results/olmo2-embed-norm]

The table pairs each seed with OLMo 2's run at the same setting and seed (what the embedding norm changes) and with
pre-norm's at its pick (what is left of the gap). The setting is OLMo 2's, not tuned for the variant: a probe beside
the suite's table, not a row of it, chosen after OLMo 2's row was seen.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

from resnorm_lm.analysis.block_measurements import markdown_table
from resnorm_lm.analysis.evidence import interval_text, mean_interval, paired_difference
from resnorm_lm.analysis.launchers import train_probe_runs
from resnorm_lm.data.cache import atomic_write
from resnorm_lm.train.arithmetic import PORTABLE_ENV
from resnorm_lm.train.runs import RunDir, copy_small_files

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "docs/results/suites/designs-12l/run-files"  # the committed suite's runs
RECIPE, REFERENCE = "olmo2-12l", "prenorm-12l"
SETTING = ("0.008", "0.5")  # OLMo 2's pick in the suite
REFERENCE_PICK = ("0.004", "0.25")  # pre-norm's
PLACEMENT = "olmo2_embed_norm"


def run_name(lr: str, warmup: str, seed: int) -> str:
    return f"cpu-lr{lr}-wf{warmup}-seed{seed}"


def suite_run(recipe: str, lr: str, warmup: str, seed: int) -> Path:
    return SUITE / recipe / run_name(lr, warmup, seed)


def probe_run(seed: int, root: Path) -> Path:
    return root / RECIPE / run_name(*SETTING, seed)


def fit_command(seed: int, root: Path, resume: bool) -> list[str]:
    """OLMo 2's seed-0 config at its pick with the embeddings normed and another seed (and its data order)."""
    lr, warmup = SETTING
    return [
        sys.executable,
        *("-m", "resnorm_lm", "fit", "--config", str(suite_run(RECIPE, lr, warmup, 0) / "config.yaml")),
        f"--model.arch.placement={PLACEMENT}",
        f"--seed_everything={seed}",
        f"--data.seed={seed}",
        f"--run.root={root}",
        f"--run.tag=lr{lr}-wf{warmup}",
        "--trainer.enable_progress_bar=false",
        *(["--ckpt_path=last"] if resume else []),
    ]


def train(seeds: list[int], root: Path, jobs: int) -> int:
    runs = [(probe_run(seed, root), functools.partial(fit_command, seed, root)) for seed in seeds]
    return train_probe_runs(runs, {**os.environ, **PORTABLE_ENV}, jobs, "olmo2 embed norm")


def val_loss(run: Path) -> float | None:
    summary = RunDir(run).summary()
    return None if summary.get("diverged") else summary.get("val_loss")


def table(root: Path, export: Path | None) -> int:
    found = sorted((root / RECIPE).glob(run_name(*SETTING, 0).removesuffix("0") + "*"))  # and each one's .log
    probe = {int(p.name.rsplit("seed", 1)[1]): p for p in found if p.is_dir() and RunDir(p).state() == "finished"}
    losses = {seed: loss for seed, run in probe.items() if (loss := val_loss(run)) is not None}
    olmo2 = {s: loss for s in losses if (loss := val_loss(suite_run(RECIPE, *SETTING, s))) is not None}
    prenorm = {s: loss for s in losses if (loss := val_loss(suite_run(REFERENCE, *REFERENCE_PICK, s))) is not None}
    rows = [
        {
            "seed": seed,
            "OLMo 2 on normed embeddings": f"{losses[seed]:.3f}",
            f"OLMo 2 ({RECIPE}), same setting": f"{olmo2[seed]:.3f}" if seed in olmo2 else "-",
            f"pre-norm at its pick ({'/'.join(REFERENCE_PICK)})": f"{prenorm[seed]:.3f}" if seed in prenorm else "-",
        }
        for seed in sorted(losses)
    ]
    summary = [
        {"": "val loss", "value": interval_text(mean_interval(list(losses.values())))},
        {
            "": "minus OLMo 2 at the same setting, paired",
            "value": interval_text(paired_difference(losses, olmo2), sign=True),
        },
        {
            "": "minus pre-norm at its pick, paired",
            "value": interval_text(paired_difference(losses, prenorm), sign=True),
        },
    ]
    text = (
        f"OLMo 2's block on normed embeddings (`--model.arch.placement={PLACEMENT}`) at OLMo 2's pick, "
        f"{SETTING[0]} with {SETTING[1]} of the run warming up, seeds {', '.join(map(str, sorted(losses)))}: "
        "validation loss; differences paired by seed, mean ± 95% t interval.\n\n"
        + markdown_table(summary)
        + "\n\n"
        + markdown_table(rows)
        + "\n"
    )
    print(text)
    if export is not None:
        copy_small_files(list(probe.values()), root, export)
        machines = sorted({RunDir(run).manifest()["hardware"]["cpu"] for run in probe.values()})
        with atomic_write(export / "olmo2-embed-norm.md", "w") as f:
            f.write(
                f"# OLMo 2 on normed embeddings ({', '.join(machines)}, portable arithmetic)\n\n"
                "`python scripts/olmo2_embed_norm.py train` then `table --export docs/results/olmo2-embed-norm`; "
                "the suite's runs: `docs/results/suites/designs-12l/run-files/`. Chosen after OLMo 2's row was seen "
                "(scripts/olmo2_embed_norm.py says why).\n\n" + text
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["train", "table"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--root", type=Path, default=Path("runs/olmo2-embed-norm"))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--export", type=Path, help="table: also copy each probe run's small files and the table here")
    args = parser.parse_args(argv)
    return train(args.seeds, args.root, args.jobs) if args.what == "train" else table(args.root.resolve(), args.export)


if __name__ == "__main__":
    raise SystemExit(main())

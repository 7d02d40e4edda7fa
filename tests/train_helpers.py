"""Shared pieces of the training tests: a tiny offline corpus and a way to run the CLI in-process."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

from resnorm_lm.cli import main

WORDS = (
    "the king queen lord lady night day love death sword crown heart blood fair sweet good bad old young "
    "come go speak hear see know think make give take stand fall rise weep laugh sleep wake die live "
    "my thy his her our your their this that what where when why how not no yes and but or if then "
    "o alas hark nay ay indeed forsooth prithee anon hence thence whither thus so too very most more"
).split()


def write_corpus(folder: Path, n_files: int = 12, words_per_file: int = 70, seed: int = 0) -> str:
    """Pseudo-verse in ``n_files`` text files; returns a glob for ``data.files``."""
    rng = np.random.RandomState(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        lines, words = [], 0
        while words < words_per_file:
            line = rng.choice(WORDS, size=rng.randint(5, 10))
            lines.append(" ".join(line).capitalize() + ("," if rng.rand() < 0.5 else "."))
            words += len(line)
        (folder / f"part{i:02d}.txt").write_text("\n".join(lines) + "\n")
    return str(folder / "*.txt")


def smoke_args(tmp_path: Path, corpus_glob: str, *extra: str, recipe: str = "prenorm-12l") -> list[str]:
    """``fit`` on the smoke profile with the local corpus, a private cache and run root."""
    return [
        "fit",
        "--recipe", recipe,
        "--profile", "smoke",
        "--data.corpus=text",
        f"--data.files=[{corpus_glob}]",
        f"--data.cache_dir={tmp_path / 'cache'}",
        "--trainer.enable_progress_bar=false",
        *extra,
    ]  # fmt: skip


def run_cli(args: list[str]) -> int:
    try:
        return main(args)
    except SystemExit as exit_:  # jsonargparse exits on parse errors
        return int(exit_.code or 0)


def train_losses(run_dir: Path) -> dict[int, float]:
    """Per-step training loss from metrics.csv."""
    with (run_dir / "metrics.csv").open() as f:
        return {int(row["step"]): float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")}


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]

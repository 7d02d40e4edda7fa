"""What the test modules share: tiny offline corpora, the smoke profile's ``fit`` arguments, the command run in
this process or in a fresh one, a tiny real sweep, and what a run wrote (its per-step losses, its final weights)."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

# At import, not inside run_cli: Lightning binds its log handler to the sys.stderr of the moment it is first
# imported, which inside a test is capsys's, closed when that test ends (the next run then logs a traceback).
from resnorm_lm.cli import main

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- corpora

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


def write_learnable_corpus(folder: Path, n_files: int = 20, words_per_file: int = 300) -> str:
    """Text in which each word is followed by one of two others: context beats word frequencies by far."""
    rng = np.random.RandomState(0)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        word, words = int(rng.randint(len(WORDS))), []
        for _ in range(words_per_file):
            words.append(WORDS[word])
            word = (7 * word + 1 + int(rng.randint(2))) % len(WORDS)
        (folder / f"part{i:02d}.txt").write_text(" ".join(words) + "\n")
    return str(folder / "*.txt")


SENTENCES = [
    "The river ran slowly past the mill, and the miller watched it from his door.",
    "In the morning the market filled with carts of apples, bread and cheese.",
    "She wrote a letter to her brother, who had gone to sea the summer before.",
    "Nobody in the village could remember a winter as cold as that one.",
    "The old clock in the hall struck nine, and the children ran upstairs to bed.",
    "A storm came in from the west, bending the trees and flattening the wheat.",
    "He counted the coins twice, then put them back in the leather purse.",
    "The teacher asked a question that none of the pupils could answer.",
    "When the lamps were lit, the street looked warmer than it was.",
    "They walked along the cliffs until the lighthouse came into view.",
    "Her garden was full of roses, beans, and a crooked pear tree.",
    "The train was late again, so the station master apologised to everyone.",
    "After supper the family sat by the fire and told stories of the war.",
    "A small dog followed the baker all the way home through the rain.",
    "The ship's captain studied the map, frowning at the narrow channel.",
    "On Sundays the bells rang across the valley from three different churches.",
]


def make_documents(n_docs: int, seed: int = 0, paragraphs: int = 3) -> list[str]:
    """``n_docs`` English documents of a few paragraphs each, deterministic in ``seed`` (the data tests' text)."""
    rng = random.Random(seed)
    docs = []
    for i in range(n_docs):
        paras = [" ".join(rng.choice(SENTENCES) for _ in range(rng.randint(3, 6))) for _ in range(paragraphs)]
        docs.append(f"Chapter {i + 1}\n\n" + "\n\n".join(paras) + "\n")
    return docs


def write_documents(folder: Path, docs: list[str], prefix: str = "doc") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, doc in enumerate(docs):
        path = folder / f"{prefix}{i:03d}.txt"
        path.write_text(doc, encoding="utf-8")
        paths.append(path)
    return paths


# ---------------------------------------------------------------- the command


def smoke_args(corpus_glob: str, *extra: str, recipe: str = "prenorm-12l", cache_dir: Path | None = None) -> list[str]:
    """``fit`` on the smoke profile with a local corpus; its data prepared in ``cache_dir``, by default in
    $RESNORM_LM_CACHE (the session's, tests/conftest.py), where runs of one corpus share it. Give ``--run.root``."""
    cache = [f"--data.cache_dir={cache_dir}"] if cache_dir is not None else []
    return [
        "fit",
        "--recipe",
        recipe,
        "--profile",
        "smoke",
        "--data.corpus=text",
        f"--data.files=[{corpus_glob}]",
        *cache,
        "--trainer.enable_progress_bar=false",
        *extra,
    ]


def run_cli(args: list[str]) -> int:
    """``resnorm-lm <args>`` in this process: its exit code."""
    try:
        return main(args)
    except SystemExit as exit_:  # jsonargparse exits on parse errors; sys.exit("message") exits 1, as Python does
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
            return 1
        return int(exit_.code or 0)


def run_cli_captured(args: list[str]) -> subprocess.CompletedProcess:
    """``run_cli`` with this process's stdout and stderr captured, as ``resnorm_lm_process`` returns them (what
    the command's own processes print goes where theirs goes)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli(args)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def default_sigint() -> None:
    """For ``preexec_fn``, in a child before exec: SIGINT's default action, as a terminal's Ctrl-C finds it,
    whatever this process inherited (a shell starts its background jobs with SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def resnorm_lm_process(args: list[str], timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """``python -m resnorm_lm <args>`` in a fresh process started in the repository, with this process's
    environment plus ``env``; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "resnorm_lm", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )


TINY_SWEEP_STEPS = 60  # lr 3e-3 gets well below the unigram loss (4.4 nats) in these; lr 1e-5 stays above it


def tiny_sweep(tmp_path: Path, corpus: str, *extra: str, train_args: str = "") -> subprocess.CompletedProcess:
    """``compare`` of prenorm-12l on the smoke profile over lr 1e-5 (stuck at the unigram level) and 3e-3, seeds 1
    and 2, ``TINY_SWEEP_STEPS`` a run, in ``tmp_path``; ``extra`` and ``train_args`` add to its arguments and its
    fits'."""
    args = [
        "compare",
        "--recipes",
        "prenorm-12l",
        "--profile",
        "smoke",
        "--lrs",
        "1e-5",
        "3e-3",
        "--warmups",
        "0.33",
        "--seeds",
        "1",
        "2",
        "--root",
        str(tmp_path / "runs"),
        "--results",
        str(tmp_path / "results"),
        "--train-args",
        f"--data.corpus=text --data.files=[{corpus}] --data.cache_dir={tmp_path / 'cache'} "
        f"--trainer.enable_progress_bar=false --trainer.max_steps={TINY_SWEEP_STEPS} "
        f"--trainer.val_check_interval={TINY_SWEEP_STEPS} "
        f"{train_args}",
        *extra,
    ]
    return run_cli_captured(args)  # compare here; the fits it starts each in its own process (as the sweep does)


# ---------------------------------------------------------------- what a run wrote


def train_losses(run_dir: Path) -> dict[int, float]:
    """Per-step training loss from metrics.csv."""
    with (run_dir / "metrics.csv").open() as f:
        return {int(row["step"]): float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")}


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def assert_same_training_state(expected: dict, actual: dict) -> None:
    """Bit-exact: every weight, every optimizer moment, the schedule and the step count."""
    assert actual["global_step"] == expected["global_step"]
    assert expected["state_dict"].keys() == actual["state_dict"].keys()
    for name, tensor in expected["state_dict"].items():
        assert torch.equal(tensor, actual["state_dict"][name]), name
    (want,), (got,) = expected["optimizer_states"], actual["optimizer_states"]
    assert want["param_groups"] == got["param_groups"] and want["state"].keys() == got["state"].keys()
    for index, moments in want["state"].items():
        for key, tensor in moments.items():
            assert torch.equal(tensor, got["state"][index][key]), (index, key)
    assert expected["lr_schedulers"] == actual["lr_schedulers"]

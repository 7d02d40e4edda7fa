"""eval, compare and generate on smoke runs over a local corpus (offline, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from resnorm_lm.cli import main
from tests.train_helpers import run_cli, smoke_args, write_corpus

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two finished smoke runs (prenorm, postnorm-triton) and one with another vocabulary."""
    tmp = tmp_path_factory.mktemp("trained")
    corpus = write_corpus(tmp / "corpus")
    root = tmp / "runs"
    for recipe in ("prenorm-12l", "postnorm-12l-triton"):
        assert run_cli(smoke_args(tmp, corpus, f"--run.root={root}", recipe=recipe)) == 0
    assert run_cli(smoke_args(tmp, corpus, f"--run.root={tmp / 'other'}", "--data.vocab_size=300")) == 0
    return {"tmp": tmp, "corpus": corpus, "root": root,
            "pre": root / "prenorm-12l" / "smoke-seed1", "post": root / "postnorm-12l-triton" / "smoke-seed1",
            "other_vocab": tmp / "other" / "prenorm-12l" / "smoke-seed1"}  # fmt: skip


def test_eval_counts_every_token_once_and_records_it(trained, capsys):
    assert main(["eval", str(trained["pre"]), str(trained["post"])]) == 0
    out = capsys.readouterr().out
    assert "| run | step |" in out and "validation_ppl" in out and "test_bpb" in out
    summary = json.loads((trained["pre"] / "eval.json").read_text())["eval"]
    for split in ("validation", "test"):
        metrics = summary[split]
        assert metrics["targets"] == metrics["tokens"] - 1  # every token but the first is predicted once
        assert metrics["ppl"] == pytest.approx(torch.tensor(metrics["loss"]).exp().item(), rel=1e-5)
        assert metrics["bpb"] > 0 and metrics["word_ppl"] > metrics["ppl"]
    assert summary["step"] == 6


def test_eval_is_deterministic(trained, capsys):
    main(["eval", str(trained["pre"]), "--split", "validation"])
    first = json.loads((trained["pre"] / "eval.json").read_text())["eval"]["validation"]["loss"]
    main(["eval", str(trained["pre"]), "--split", "validation"])
    assert json.loads((trained["pre"] / "eval.json").read_text())["eval"]["validation"]["loss"] == first


def test_runs_with_different_tokenizers_are_compared_by_bpb_only(trained, capsys):
    assert main(["eval", str(trained["pre"]), str(trained["other_vocab"]), "--split", "validation"]) == 0
    out = capsys.readouterr().out
    assert "not comparable" in out and "compared by bits per byte only" in out
    assert "validation_ppl" not in out and "validation_bpb" in out


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", None])
def test_eval_refuses_corrupt_truncated_or_foreign_checkpoints(trained, tmp_path, capsys, content):
    bad = tmp_path / "bad.ckpt"
    if content is None:  # a truncated real checkpoint
        data = (trained["pre"] / "checkpoints" / "last.ckpt").read_bytes()
        content = data[: len(data) // 2]
    bad.write_bytes(content)
    assert main(["eval", str(bad)]) == 2
    assert "corrupt, truncated or not a checkpoint" in capsys.readouterr().err
    torch.save({"state_dict": {}, "hyper_parameters": {}}, bad)
    assert main(["eval", str(bad)]) == 2
    assert "not a resnorm-lm checkpoint" in capsys.readouterr().err


def test_eval_over_two_ddp_processes_matches_one(trained):
    single = json.loads((trained["pre"] / "eval.json").read_text())
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "resnorm_lm", "eval", str(trained["pre"]), "--devices", "2",
                           "--split", "validation"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    both = json.loads((trained["pre"] / "eval.json").read_text())["eval"]["validation"]
    ref = single["eval"]["validation"] if "eval" in single else None
    assert both["targets"] == both["tokens"] - 1  # each target counted once across the two ranks
    if ref is not None:
        assert both["loss"] == pytest.approx(ref["loss"], rel=1e-5)


def test_generate_streams_a_deterministic_sample_for_each_backend(trained, capsys):
    texts = []
    for run in (trained["pre"], trained["post"], trained["pre"]):
        assert main(["generate", str(run), "--prompt", "The king", "--tokens", "20", "--seed", "3"]) == 0
        texts.append(capsys.readouterr().out)
    assert all(t.startswith("The king") and len(t) > len("The king") + 5 for t in texts)
    assert texts[0] == texts[2]  # same seed, same text


def test_compare_trains_missing_resumes_unfinished_and_reuses_finished(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus")
    root, results = tmp_path / "runs", tmp_path / "results"
    train_args = f"--data.corpus=text --data.files=[{corpus}] --data.cache_dir={tmp_path / 'cache'} "
    train_args += "--trainer.enable_progress_bar=false"
    # an unfinished run: stopped at step 3 of 6
    assert run_cli(smoke_args(tmp_path, corpus, f"--run.root={root}", "--run.stop_after_steps=3",
                              recipe="postnorm-12l")) == 0  # fmt: skip
    args = ["compare", "--recipes", "prenorm-12l", "postnorm-12l", "--profile", "smoke", "--seeds", "1", "2",
            "--root", str(root), "--results", str(results), f"--train-args={train_args}"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "resnorm_lm", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming postnorm-12l (smoke, recipe lr, warmup of the recipe, seed 1)" in proc.stdout
    assert proc.stdout.count("compare: training") == 3
    table = (results / "smoke" / "compare.md").read_text()
    assert "| prenorm-12l | - | - | 2 |" in table and "| postnorm-12l |" in table and " ± " in table
    rows = (results / "smoke" / "compare.csv").read_text().splitlines()
    assert rows[0].startswith("recipe,") and len(rows) == 3
    assert (results / "smoke" / "loss_curves.png").stat().st_size > 10_000
    assert (results / "smoke" / "grad_norms.png").stat().st_size > 10_000
    again = subprocess.run([sys.executable, "-m", "resnorm_lm", *args], cwd=REPO, capture_output=True, text=True,
                           timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    assert again.returncode == 0 and "compare: training" not in again.stdout and "resuming" not in again.stdout


def test_compare_rejects_unknown_recipes(capsys):
    assert main(["compare", "--recipes", "prenorm-99l", "--profile", "smoke"]) == 2
    assert "unknown recipe 'prenorm-99l'" in capsys.readouterr().err

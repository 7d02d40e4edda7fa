"""The notebooks execute end to end (small settings) through notebooks/run_notebooks.py.

Every claim in a notebook is an ``assert`` in a code cell, so executing them checks the claims.
Notebook 03 runs twice: on a tiny fake ``make compare`` output (sparse Lightning-style metrics,
missing and empty columns, a recipe without runs, a diverged run) and on an empty results directory.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nbclient", reason="notebook tests need nbclient, nbformat and ipykernel")
pytest.importorskip("nbformat", reason="notebook tests need nbclient, nbformat and ipykernel")
pytest.importorskip("ipykernel", reason="notebook tests need nbclient, nbformat and ipykernel")
import nbformat  # noqa: E402

pytestmark = pytest.mark.training  # each test starts the runner and a Jupyter kernel, which import torch

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "notebooks" / "run_notebooks.py"
N_LAYER = 4


def run_notebooks(out_dir: Path, *notebooks: str, env: dict[str, str] | None = None, timeout: int = 120):
    full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
    cmd = [sys.executable, str(RUNNER), "--small", "--timeout", "60", "--output-dir", str(out_dir), "--notebooks"]
    return subprocess.run(
        [*cmd, *notebooks], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout, check=False
    )


def outputs(path: Path) -> tuple[str, int]:
    """All text a notebook printed, and the number of images it drew."""
    nb = nbformat.read(path, as_version=4)
    text, images = [], 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                text.append(out.text)
            elif out.output_type == "error":
                text.append("\n".join(out.traceback))
            elif "data" in out:
                images += "image/png" in out["data"]
                text.append(out["data"].get("text/plain", ""))
    return "\n".join(text), images


def test_notebooks_01_and_02_execute_and_their_asserts_hold(tmp_path):
    result = run_notebooks(tmp_path, "01", "02")
    assert result.returncode == 0, result.stdout + result.stderr
    text, images = outputs(tmp_path / "02_gradient_flow.ipynb")
    assert "4 layers" in text and "all checks pass" in text
    assert images == 2  # the gradient / stream figure and the Xavier figure
    assert (tmp_path / "01_layernorm_by_hand.ipynb").is_file()


def write_metrics(path: Path, *, steps: int, val_loss: float, with_val_bpb: bool, with_grads: bool, diverge=False):
    """A metrics.csv shaped like Lightning's CSVLogger: one header, rows at different steps, many cells empty."""
    layers = [f"grad_norm/layer_{i:02d}" for i in range(N_LAYER)]
    header = ["epoch", "step", "train/loss", "val/loss", "val/ppl", "val/bpb"]  # no lr column at all
    header += ["grad_norm/total", *layers] if with_grads else []
    rows = []
    for step in range(0, steps + 1, 10):
        row = {"epoch": 0, "step": step, "train/loss": 6.0 - step / steps}
        if with_grads:
            for i, name in enumerate(layers):
                row[name] = 0.5 * (i + 1) / (1 + step / 10)
            row["grad_norm/total"] = sum(row[n] ** 2 for n in layers) ** 0.5
        rows.append(row)
        if step and step % 50 == 0:
            loss = float("inf") if diverge and step == steps else val_loss + 1.0 - step / steps
            val = {"epoch": 0, "step": step, "val/loss": loss, "val/ppl": math.exp(min(loss, 50))}
            if with_val_bpb:
                val["val/bpb"] = loss / math.log(2) / 4
            rows.append(val)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)


def make_fake_results(tmp_path: Path) -> tuple[Path, Path]:
    results, runs = tmp_path / "results" / "cpu", tmp_path / "runs"
    results.mkdir(parents=True)
    # no tokens_per_s column; test_ppl_mean and test_bpb_mean entirely empty; rezero-12l has no run directory
    header = "recipe,n_seeds,n_diverged,val_loss_mean,val_loss_std,val_ppl_mean,val_bpb_mean,test_ppl_mean,"
    header += "test_bpb_mean,params,tokens,status"
    (results / "compare.csv").write_text(
        header + "\n"
        "prenorm-12l,2,0,4.10,0.02,60.3,1.5,,,2400000,1024000,ok\n"
        "postnorm-12l,2,1,4.30,,73.7,1.6,,,2400000,1024000,diverged\n"
        "b2t-12l,1,0,4.20,,66.7,,,,2400000,1024000,ok\n"
        "rezero-12l,1,0,,,,,,,,,missing\n"
    )
    for seed, loss in ((1, 4.09), (2, 4.11)):
        write_metrics(
            runs / "prenorm-12l" / f"cpu-seed{seed}" / "metrics.csv",
            steps=100,
            val_loss=loss,
            with_val_bpb=True,
            with_grads=True,
        )
    write_metrics(
        runs / "postnorm-12l" / "cpu-seed1" / "metrics.csv",
        steps=100,
        val_loss=4.3,
        with_val_bpb=False,
        with_grads=True,
    )
    write_metrics(
        runs / "postnorm-12l" / "cpu-seed2" / "metrics.csv",
        steps=100,
        val_loss=4.3,
        with_val_bpb=False,
        with_grads=True,
        diverge=True,
    )
    write_metrics(
        runs / "b2t-12l" / "cpu-seed1" / "metrics.csv", steps=100, val_loss=4.2, with_val_bpb=False, with_grads=False
    )
    (runs / "prenorm-12l" / "smoke-seed1").mkdir(parents=True)  # another profile: ignored
    for recipe, seed, loss in (("prenorm-12l", 1, 4.09), ("prenorm-12l", 2, 4.11), ("postnorm-12l", 1, 4.3)):
        summary = {"step": 100, "val_loss": loss, "val_ppl": math.exp(loss), "val_bpb": None, "diverged": False}
        (runs / recipe / f"cpu-seed{seed}" / "eval.json").write_text(json.dumps(summary))
    return results, runs


def test_notebook_03_on_fake_results(tmp_path):
    results, runs = make_fake_results(tmp_path)
    out = tmp_path / "out"
    result = run_notebooks(out, "03", env={"RESNORM_LM_RESULTS": str(results), "RESNORM_LM_RUNS": str(runs)})
    assert result.returncode == 0, result.stdout + result.stderr
    text, images = outputs(out / "03_compare_runs.ipynb")
    assert "no results" not in text
    assert "prenorm-12l" in text and "rezero-12l" in text  # the table, including the recipe without runs
    # a table without a grid (the recipes' own settings): no lr/warmup columns, runs are <profile>-seed<k>
    assert "not in compare.csv (or empty): lr, warmup, lr_edge, test_ppl_mean, test_bpb_mean, tokens_per_s" in text
    assert "cpu-seed2: no usable eval.json" in text  # the diverged postnorm run has none
    assert "5 runs plotted" in text  # b2t's metrics.csv has validation rows too
    assert "postnorm-12l seed 2: non-finite validation loss after step 50" in text
    assert "2 recipes with per-layer gradient norms" in text  # b2t logged none
    assert images == 2


def test_notebook_03_without_results_says_so(tmp_path):
    out = tmp_path / "out"
    env = {"RESNORM_LM_RESULTS": str(tmp_path / "results" / "cpu"), "RESNORM_LM_RUNS": str(tmp_path / "runs")}
    result = run_notebooks(out, "03", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    text, images = outputs(out / "03_compare_runs.ipynb")
    assert "no results: run `make compare` first" in text
    assert images == 0


def test_runner_fails_on_a_failing_cell(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("assert 1 + 1 == 3, 'a false claim'")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "99_fails.ipynb"
    nbformat.write(nb, path)
    result = run_notebooks(tmp_path / "out", str(path))
    assert result.returncode == 1
    assert "a false claim" in result.stderr and "99_fails.ipynb" in result.stderr

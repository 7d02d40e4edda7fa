"""The gradient-balance reader: the last block's gradient norm over the first's across a run's logged steps."""

from __future__ import annotations

import csv
from pathlib import Path

from resnorm_lm.analysis.gradient_balance import GradientBalance, main


def write_run(run_dir: Path, rows: list[tuple[int, list[float]]]) -> Path:
    """A metrics.csv whose logged rows carry per-block gradient norms (blocks 0..n-1), and a row without them."""
    run_dir.mkdir(parents=True)
    n = len(rows[0][1])
    columns = ["step", "train/loss", *(f"grad_norm/layer_{i:02d}" for i in range(n))]
    with (run_dir / "metrics.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for step, norms in rows:
            writer.writerow([step, 5.0, *norms])
            writer.writerow([step, 5.0, *([""] * n)])  # a validation-only row, say
    return run_dir


def test_the_ratio_is_last_over_first_block_in_block_order_at_any_depth(tmp_path):
    # 12 blocks, block 11 last
    norms = [[1.0] + [0.5] * 10 + [3.0], [0.01] + [0.5] * 10 + [2.0], [0.5] + [0.5] * 10 + [1.0]]
    run = write_run(tmp_path / "run", [(0, norms[0]), (10, norms[1]), (20, norms[2])])
    b = GradientBalance.of(run, above=10)
    assert (b.first, b.peak, b.peak_step, b.steps_above, b.logged_steps, b.last) == (3.0, 200.0, 10, 1, 3, 2.0)


def test_a_first_block_without_gradient_gives_a_finite_ratio(tmp_path):
    run = write_run(tmp_path / "run", [(0, [0.0, 1.0])])
    assert GradientBalance.of(run, above=10).peak == 1e12


def test_the_command_prints_a_row_per_run_and_refuses_a_folder_without_metrics(tmp_path, capsys):
    a = write_run(tmp_path / "a", [(0, [1.0, 1.0]), (10, [0.1, 2.0])])
    b = write_run(tmp_path / "b", [(0, [1.0, 4.0])])
    assert main([str(a), str(b), "--above", "3"]) == 0
    out = capsys.readouterr().out
    assert f"| {a} | 1.0 | 20.0 (10) | 1 of 2 | 20.0 |" in out and f"| {b} | 4.0 | 4.0 (0) | 1 of 1 | 4.0 |" in out
    assert main([str(tmp_path / "nothing")]) == 2
    assert "no metrics.csv there" in capsys.readouterr().err

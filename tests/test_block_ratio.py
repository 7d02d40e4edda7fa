"""block_ratio: the last block's value of a per-block metric over the first's across a run's logged steps."""

from __future__ import annotations

import csv
from pathlib import Path

from resnorm_lm.analysis.block_measurements import BlockRatio, block_ratio_main


def write_run(run_dir: Path, rows: list[tuple[int, list[float]]], prefix: str = "grad_norm") -> Path:
    """A metrics.csv whose logged rows carry a per-block metric (blocks 0..n-1), each followed by a row without it."""
    run_dir.mkdir(parents=True)
    n = len(rows[0][1])
    columns = ["step", "train/loss", *(f"{prefix}/layer_{i:02d}" for i in range(n))]
    with (run_dir / "metrics.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for step, values in rows:
            writer.writerow([step, 5.0, *values])
            writer.writerow([step, 5.0, *([""] * n)])  # a validation-only row, say
    return run_dir


def test_the_ratio_is_last_over_first_block_at_every_logged_step(tmp_path):
    norms = [[1.0] + [0.5] * 10 + [3.0], [0.01] + [0.5] * 10 + [2.0], [0.5] + [0.5] * 10 + [1.0]]  # 12 blocks
    run = write_run(tmp_path / "run", [(0, norms[0]), (10, norms[1]), (20, norms[2])])
    r = BlockRatio.of(run, "grad_norm", above=10)
    assert (r.first, r.peak, r.peak_step, r.steps_above, r.logged_steps, r.last) == (3.0, 200.0, 10, 1, 3, 2.0)
    assert r.end == 2.0  # the last 10% of 20 steps holds step 20 only


def test_at_the_end_is_the_mean_of_the_ratios_logged_over_the_last_tenth_of_the_steps(tmp_path):
    steps = [(s, [1.0, float(s)]) for s in range(0, 101, 5)]  # ratio = step; the last 10%: steps 90, 95, 100
    assert BlockRatio.of(write_run(tmp_path / "run", steps), "grad_norm", above=10).end == 95.0


def test_the_stream_metric_is_read_from_its_own_columns(tmp_path):
    run = write_run(tmp_path / "run", [(0, [0.1, 0.2, 0.4]), (10, [10.0, 12.0, 15.0])], prefix="stream_rms")
    r = BlockRatio.of(run, "stream_rms", above=3)
    assert (r.first, r.last, r.steps_above) == (4.0, 1.5, 1)


def test_a_first_block_without_gradient_gives_a_finite_ratio(tmp_path):
    run = write_run(tmp_path / "run", [(0, [0.0, 1.0])])
    assert BlockRatio.of(run, "grad_norm", above=10).peak == 1e12


def test_the_command_prints_and_writes_a_row_per_run_and_refuses_a_folder_without_metrics(tmp_path, capsys):
    a = write_run(tmp_path / "a", [(0, [1.0, 1.0]), (10, [0.1, 2.0])])
    b = write_run(tmp_path / "b", [(0, [1.0, 4.0])])
    assert block_ratio_main([str(a), str(b), "--above", "3", "--csv", str(tmp_path / "out.csv")]) == 0
    out = capsys.readouterr().out
    assert (
        f"| {a} | 1.00 | 20.00 (10) | 1 of 2 | 20.00 | 20.00 |" in out
        and f"| {b} | 4.00 | 4.00 (0) | 1 of 1 | 4.00 | 4.00 |" in out
    )
    rows = list(csv.DictReader((tmp_path / "out.csv").open()))
    assert [(row["metric"], float(row["peak"]), row["peak_step"]) for row in rows] == [
        ("grad_norm", 20.0, "10"),
        ("grad_norm", 4.0, "0"),
    ]
    assert block_ratio_main([str(a), "--metric", "stream_rms"]) == 2  # a run without the stream's columns
    assert "logs no per-block stream_rms" in capsys.readouterr().err
    assert block_ratio_main([str(tmp_path / "nothing")]) == 2
    assert "no metrics.csv there" in capsys.readouterr().err

"""The side-by-side step timer of ``make bench`` (benchmarks/bench_training.py): every variant is built as named,
timed, and set against the variant it is compared with."""

from __future__ import annotations

import pytest
import torch

from benchmarks.bench_training import bench_steps

SHAPE = {"vocab": 64, "block": 8, "heads": 2, "width": 16, "batch": 2}


def test_each_variant_is_timed_against_its_own_reference():
    variants = [
        {"placement": p, "norm": n, "compile": False}
        for p in ("prenorm", "postnorm")
        for n in ("layernorm", "dyt_llm" if p == "prenorm" else "rmsnorm")
    ]
    rows = bench_steps(2, torch.device("cpu"), variants, SHAPE, relative_to={"norm": "layernorm"})
    assert [(r["placement"], r["norm"]) for r in rows] == [(v["placement"], v["norm"]) for v in variants]
    assert all(r["step_s"] > 0 for r in rows)
    by = {(r["placement"], r["norm"]): r for r in rows}
    assert by["prenorm", "layernorm"]["ratio"] == by["postnorm", "layernorm"]["ratio"] == 1.0  # each its own base
    for placement, norm in (("prenorm", "dyt_llm"), ("postnorm", "rmsnorm")):
        expected = by[placement, norm]["step_s"] / by[placement, "layernorm"]["step_s"]
        assert by[placement, norm]["ratio"] == pytest.approx(expected, rel=0.02)  # times are rounded to 0.1 ms

"""The subnormal benchmark: what it counts as subnormal, that it leaves the process's arithmetic as it found it,
and that it runs on a trained run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmarks.bench_subnormals import SMALLEST_NORMAL, flush_supported, main, measure, subnormal_count


def test_subnormals_are_the_nonzero_values_below_the_smallest_normal():
    values = torch.tensor([0.0, SMALLEST_NORMAL / 2, -SMALLEST_NORMAL / 4, SMALLEST_NORMAL, 1.0, -3e-39])
    assert subnormal_count([values, torch.zeros(4)]) == (3, 10)


class SubnormalGradients(nn.Module):
    """A model of the GPT's call shape whose weight's gradient is x * 1e-39 per element: subnormal."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(8))

    def forward(self, idx, targets):
        x = idx.float().mean(0)[:8] + 1.0  # (8,): between 1 and the largest id plus 1
        return None, (self.weight * x * 1e-39).sum()


@pytest.mark.skipif(not flush_supported(), reason="this CPU cannot flush subnormals")
def test_measure_counts_subnormal_gradients_and_leaves_flushing_off():
    idx = torch.randint(4, (2, 8))
    m = measure(SubnormalGradients(), idx, idx, rounds=2)
    assert m["subnormal_grads"] == 8 and m["grads"] == 8  # counted on an unflushed pass
    assert m["kept_s"] > 0 and m["flushed_s"] > 0 and m["ratio"] == m["kept_s"] / m["flushed_s"]
    assert torch.tensor(SMALLEST_NORMAL) * torch.tensor(0.25) != 0  # flushing off again for what runs next


def test_it_times_a_trained_run(recipe_run, capsys):
    run = recipe_run("prenorm-12l")
    assert main([str(run), "--rounds", "2", "--batch", "2"]) == (0 if flush_supported() else 1)
    out = capsys.readouterr().out
    if flush_supported():
        row = [line for line in out.splitlines() if line.startswith(f"| {run} |")]
        assert len(row) == 1 and row[0].endswith(" |") and " of " in row[0], out

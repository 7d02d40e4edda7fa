"""The step's anatomy (benchmarks/step_anatomy.py): every kind of work is found where it runs, and the table prints."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import benchmarks.step_anatomy as anatomy


def event(*names):
    """A profiler event named ``names[0]`` inside ``names[1]`` inside ..."""
    parent = None
    for name in reversed(names):
        parent = SimpleNamespace(name=name, cpu_parent=parent)
    return parent


@pytest.mark.parametrize(
    "names, kind",
    [
        (("aten::mm", "MmBackward0", "autograd::engine::evaluate_function: MmBackward0"), "matmuls"),
        (("aten::mm", "resnorm_lm.model.loss.LinearCrossEntropy"), "matmuls"),
        (("aten::logsumexp", "resnorm_lm.model.loss.LinearCrossEntropy"), "cross-entropy"),
        (("aten::mul", "LinearCrossEntropyBackward"), "cross-entropy"),
        (("aten::bmm", "aten::_scaled_dot_product_attention_math"), "attention"),
        (("aten::_softmax_backward_data", "SoftmaxBackward0"), "attention"),
        (("aten::_log_softmax", "aten::log_softmax", "aten::cross_entropy_loss"), "cross-entropy"),
        (("aten::linalg_vector_norm", "clip_grad_norm"), "optimizer and clip"),
        (("aten::native_layer_norm", "aten::layer_norm"), "norms"),
        (("aten::copy_", "aten::_to_copy", "aten::to"), "casts"),
        (("aten::gelu",), anatomy.OTHER),
    ],
)
def test_each_operator_goes_to_the_kind_named_by_it_or_around_it(names, kind):
    assert anatomy.kind_of(event(*names)) == kind


def test_a_small_step_is_measured_and_its_time_found_in_each_kind(monkeypatch, capsys):
    monkeypatch.setattr(anatomy, "SHAPE", dict(vocab_size=256, block_size=16, n_layer=2, n_head=2, n_embd=32))
    monkeypatch.setattr(anatomy, "BATCH", 2)
    rows = [anatomy.measure("32-true", False, steps=2, profiled=1, plain=plain) for plain in (True, False)]
    for row in rows:
        assert row["step_ms"] > 0 and row["flops"] > 0
        for kind in ("matmuls", "attention", "cross-entropy", "norms", "optimizer and clip"):
            assert row["by_kind"].get(kind, 0) > 0, kind
    anatomy.print_table(rows, {"32-true": 100.0}, "pretend: no native bf16", max_steps=500)
    out = capsys.readouterr().out
    assert "share of the GEMM peak" in out and "bf16-mixed not measured: pretend" in out
    assert "fp32 eager against fp32 eager plain:" in out
    assert "fp32 eager: attention on CPU in fp32: SDPA's" in out  # the kernel chosen, said

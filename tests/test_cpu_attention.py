"""Attention on a CPU: both SDPA backends exact to their dtype, the measured choice kept per machine and used by
the model and by runs; under bf16 autocast every weight is cast once per forward."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

import resnorm_lm.model.loss as loss_module
import resnorm_lm.train.cpu_attention as cpu_attention
from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.layers import CPU_SDPA_BACKENDS, CausalSelfAttention, use_cpu_sdpa_backend
from tests.smoke import run_cli, smoke_args


@pytest.fixture(autouse=True)
def restore_backends():
    saved = dict(CPU_SDPA_BACKENDS)
    yield
    CPU_SDPA_BACKENDS.clear()
    CPU_SDPA_BACKENDS.update(saved)


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RESNORM_LM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def attention_and_grads(dtype, backend, q, k, v, grad):
    q, k, v = (t.to(dtype).detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(backend):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
    y.backward(grad.to(dtype))
    return [t.double() for t in (y, q.grad, k.grad, v.grad)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend", ["flash", "math"])
def test_each_backend_is_exact_to_its_dtypes_rounding(dtype, backend):
    """Against fp64, forward and every gradient, on a length that is no power of two; the error allowed is the
    dtype's rounding of inputs and outputs times the attention's own scale, not a figure from one machine."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(2, 3, 37, 16, generator=gen, dtype=torch.float64) for _ in range(4))
    exact = attention_and_grads(torch.float64, SDPBackend.MATH, q, k, v, grad)
    got = attention_and_grads(dtype, cpu_attention.BACKENDS[backend], q, k, v, grad)
    eps = torch.finfo(dtype).eps
    for g, e in zip(got, exact):
        assert (g - e).abs().max().item() <= 16 * eps * e.abs().max().item()


@pytest.mark.training
def test_the_model_runs_attention_with_the_backend_chosen_for_the_dtype(monkeypatch, fresh_dynamo):
    cfg = GPTConfig(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16)
    model, idx = GPT(cfg), torch.randint(0, 50, (2, 8))
    ran = []
    original = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        ran.append(torch._C._get_flash_sdp_enabled())  # what the call may use: flash on or off
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    CPU_SDPA_BACKENDS.clear()  # runs earlier in this process may have chosen for bf16
    use_cpu_sdpa_backend(torch.float32, SDPBackend.MATH)
    want = model(idx)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(idx)  # bf16 inputs: no choice made for them, SDPA's own (flash enabled)
    use_cpu_sdpa_backend(torch.float32, SDPBackend.FLASH_ATTENTION)
    torch.testing.assert_close(model(idx)[0], want)
    assert ran == [False, True, True]
    model.train()
    for m in model.modules():
        if isinstance(m, CausalSelfAttention):
            m.dropout = 0.5  # CPU flash cannot run dropout: math takes over instead of an error
    model(idx)
    compiled = torch.compile(model.eval(), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(idx)[0], want)


def pretend_measure(monkeypatch, flash_ms, math_ms):
    calls = []

    def measure(dtype, shape, pairs=cpu_attention.PAIRS):
        calls.append((dtype, tuple(shape)))
        return cpu_attention.AttentionProbe(dtype, list(shape), flash_ms, math_ms, pairs, "2026-01-01 00:00")

    monkeypatch.setattr(cpu_attention, "measure", measure)
    return calls


def test_the_faster_backend_is_chosen_kept_per_dtype_and_shape_and_measured_again_on_request(monkeypatch, cache):
    calls = pretend_measure(monkeypatch, flash_ms=15.0, math_ms=5.0)
    probe, source = cpu_attention.choose("bf16", (16, 4, 128, 32))
    assert probe.backend == "math" and "measured now, kept in" in source
    probe, source = cpu_attention.choose("bf16", (16, 4, 128, 32))
    assert probe.backend == "math" and "read from" in source and len(calls) == 1
    cpu_attention.choose("bf16", (8, 4, 128, 32))  # another shape: its own measurement
    cpu_attention.choose("bf16", (16, 4, 128, 32), remeasure=True)
    assert len(calls) == 3
    pretend_measure(monkeypatch, flash_ms=3.0, math_ms=5.0)
    assert cpu_attention.choose("fp32", (16, 4, 128, 32))[0].backend == "flash"


def test_use_for_run_sets_the_backend_for_the_runs_dtype_only(monkeypatch, cache):
    pretend_measure(monkeypatch, flash_ms=15.0, math_ms=5.0)
    CPU_SDPA_BACKENDS.clear()
    line = cpu_attention.use_for_run("bf16-mixed", 16, 4, 128, 128)
    assert CPU_SDPA_BACKENDS == {torch.bfloat16: SDPBackend.MATH}
    assert line.startswith("attention on CPU in bf16: SDPA's math backend")
    assert cpu_attention.use_for_run("64-true", 16, 4, 128, 128) is None


def test_the_probe_shape_is_the_runs_unless_its_scores_would_not_fit():
    assert cpu_attention.probe_shape(16, 4, 128, 32) == (16, 4, 128, 32)  # the cpu profile: as it runs
    b, h, t, d = cpu_attention.probe_shape(16, 4, 100_000, 32)  # a context far beyond any profile
    assert (b, h, d) == (1, 4, 32) and b * h * t * t <= cpu_attention.PROBE_SCORES and t >= 1024


def test_the_real_probe_measures_both_backends_and_restores_the_thread_count():
    threads = torch.get_num_threads()
    probe = cpu_attention.measure("fp32", (2, 2, 16, 8), pairs=1)
    assert probe.flash_ms > 0 and probe.math_ms > 0 and probe.backend in ("flash", "math")
    assert torch.get_num_threads() == threads


def test_the_real_probe_leaves_the_runs_rng_stream_untouched():
    torch.manual_seed(1)  # a fit measures after seeding and before building its model (precision.py)
    before = torch.get_rng_state()
    cpu_attention.measure("fp32", (2, 2, 16, 8), pairs=1)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_run_says_and_records_its_attention_kernel_and_compile_setting(
    tmp_path, capsys, monkeypatch, cache, smoke_corpus, data_cache
):
    pretend_measure(monkeypatch, flash_ms=3.0, math_ms=5.0)
    root = tmp_path / "runs"
    args = smoke_args(
        smoke_corpus, f"--run.root={root}", "--trainer.precision=32-true", "--trainer.max_steps=2", cache_dir=data_cache
    )  # the session's prepared data; the attention probe in this test's cache
    assert run_cli(args) == 0
    err = capsys.readouterr().err
    assert "resnorm-lm: attention on CPU in fp32: SDPA's flash backend (5.0 ms math, 3.0 ms flash" in err
    assert "resnorm-lm: torch.compile off (model.compile, set by the smoke profile" in err
    kernels = json.loads((root / "prenorm-12l" / "smoke-seed1" / "manifest.json").read_text())["kernels"]
    assert kernels["attention"].startswith("attention on CPU in fp32: SDPA's flash backend")
    assert kernels["compile"].startswith("torch.compile off")


class CastCounter(TorchDispatchMode):
    """Counts the dtype casts (aten._to_copy) of each parameter's storage."""

    def __init__(self, params):
        super().__init__()
        self.names = {p.data_ptr(): name for name, p in params}
        self.casts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in self.names:
            self.casts[self.names[args[0].data_ptr()]] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("tie", [True, False])
def test_under_bf16_autocast_every_weight_is_cast_once_per_forward(tie, monkeypatch):
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 64 * 5)  # the loss in chunks of 5 rows: one cast for all
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, tie_embeddings=tie)
    model = GPT(cfg)
    idx = torch.randint(0, 64, (2, 16))
    matrices = [(n, p) for n, p in model.named_parameters() if p.dim() == 2 and "wpe" not in n]
    counter = CastCounter(matrices)
    with counter, torch.autocast("cpu", dtype=torch.bfloat16):
        model(idx, idx)[1].backward()
    cast = {n for n, _ in matrices if n != "wte.weight" or tie}  # an untied wte feeds only the embedding lookup
    assert set(counter.casts) == cast
    assert set(counter.casts.values()) == {1}

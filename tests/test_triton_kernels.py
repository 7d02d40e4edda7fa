"""The fused Triton Add & Norm kernels against the torch backend, under TRITON_INTERPRET=1 on CPU."""

from __future__ import annotations

import pytest
import torch

from resnorm_lm.model import GPT, GPTConfig
from resnorm_lm.norms import BackendUnavailableError, TritonBackend, build_norm

pytest.importorskip("triton", reason="the triton extra is not installed")

CONFIGS = [("layernorm", True), ("layernorm", False), ("rmsnorm", False)]  # (norm, bias)
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}  # relative error, per dtype


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12)).item()


def pair(norm: str, n: int, bias: bool):
    """A triton-backend norm and a torch-backend twin with the same random parameters."""
    fused, plain = build_norm(norm, n, backend="triton", bias=bias), build_norm(norm, n, bias=bias)
    with torch.no_grad():
        for p in fused.parameters():
            p.normal_(1.0, 0.3)
        plain.load_state_dict(fused.state_dict())
    return fused, plain


def check_parity(norm, bias, rows, n, with_d, dtype, transpose=False):
    fused, plain = pair(norm, n, bias)
    shape = (n, rows) if transpose else (rows, n)
    x0 = (torch.randn(shape) * 2 + 0.3).to(dtype)
    d0 = torch.randn(shape).to(dtype)
    if transpose:  # non-contiguous inputs: (rows, n) views with stride 1 along rows
        x0, d0 = x0.t(), d0.t()
    dy, ds = torch.randn(rows, n), torch.randn(rows, n)
    # reference: torch backend in fp32 on the same rounded inputs
    xr, dr = x0.float().requires_grad_(), d0.float().requires_grad_()
    x, d = x0.clone().requires_grad_(), d0.clone().requires_grad_()
    if transpose:
        x, d = x0.detach().requires_grad_(), d0.detach().requires_grad_()
    if with_d:
        y, s = fused.add_norm(x, d)
        yr, sr = plain.add_norm(xr, dr)
        assert s.dtype == dtype and s.shape == x.shape
        assert rel(s, sr) < TOL[dtype]
        loss, loss_ref = (y.float() * dy).sum() + (s.float() * ds).sum(), (yr * dy).sum() + (sr * ds).sum()
        inputs, inputs_ref = [x, d], [xr, dr]
    else:
        y, yr = fused(x), plain(xr)
        loss, loss_ref = (y.float() * dy).sum(), (yr * dy).sum()
        inputs, inputs_ref = [x], [xr]
    assert y.dtype == dtype and y.shape == x.shape
    assert rel(y, yr) < TOL[dtype], f"forward: {rel(y, yr):.2e}"
    params, params_ref = list(fused.parameters()), list(plain.parameters())
    got = torch.autograd.grad(loss, inputs + params)
    want = torch.autograd.grad(loss_ref, inputs_ref + params_ref)
    names = ["dx", "dd"][: len(inputs)] + [f"d{n}" for n, _ in fused.named_parameters()]
    for name, g, w in zip(names, got, want):
        assert g.shape == w.shape, name
        err = rel(g, w)
        assert err < 2 * TOL[dtype], f"{name}: relative error {err:.2e} ({dtype})"


@pytest.mark.parametrize("with_d", [True, False], ids=["add_norm", "norm"])
@pytest.mark.parametrize("rows", [1, 37, 130], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("n", [64, 768, 1000], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("norm, bias", CONFIGS, ids=["ln", "ln-nobias", "rms"])
def test_fp32_parity(norm, bias, n, rows, with_d):
    check_parity(norm, bias, rows, n, with_d, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("with_d", [True, False], ids=["add_norm", "norm"])
@pytest.mark.parametrize("norm, bias", CONFIGS, ids=["ln", "ln-nobias", "rms"])
def test_half_precision_parity_against_fp32(norm, bias, with_d, dtype):
    check_parity(norm, bias, 37, 768, with_d, dtype)


@pytest.mark.parametrize("norm, bias", CONFIGS, ids=["ln", "ln-nobias", "rms"])
def test_non_contiguous_inputs(norm, bias):
    check_parity(norm, bias, 45, 96, True, torch.float32, transpose=True)


def test_three_dimensional_stream_and_mixed_dtypes():
    fused, plain = pair("layernorm", 64, True)
    x = torch.randn(2, 9, 64, requires_grad=True)  # the fp32 stream
    d = torch.randn(2, 9, 64, dtype=torch.bfloat16, requires_grad=True)  # a bf16 sublayer output
    y, s = fused.add_norm(x, d)
    yr, sr = plain.add_norm(x, d)
    assert s.dtype == sr.dtype == torch.float32 and y.shape == (2, 9, 64)
    torch.testing.assert_close(y, yr, atol=1e-5, rtol=1e-5)
    (y.sum() + s.sum()).backward()
    assert d.grad.dtype == torch.bfloat16 and x.grad.dtype == torch.float32


def test_module_parameters_match_torch():
    ln = build_norm("layernorm", 32, backend="triton")
    assert torch.equal(ln.weight, torch.ones(32)) and torch.equal(ln.bias, torch.zeros(32))
    assert "bias" not in dict(build_norm("layernorm", 32, backend="triton", bias=False).named_parameters())
    assert [n for n, _ in build_norm("rmsnorm", 32, backend="triton").named_parameters()] == ["weight"]
    assert (
        build_norm("layernorm", 32, backend="triton").state_dict().keys()
        == build_norm("layernorm", 32).state_dict().keys()
    )


def test_rows_over_64_kb_are_refused_clearly():
    norm = build_norm("layernorm", 20000, backend="triton")
    with pytest.raises(ValueError, match="rows up to 65536 bytes; hidden size 20000 .* use norm_backend: torch"):
        norm(torch.randn(2, 20000))


def test_other_norms_with_triton_are_refused_clearly():
    for name in ("scalenorm", "dyt", "none"):
        with pytest.raises(BackendUnavailableError, match=f"implements layernorm and rmsnorm, not '{name}'"):
            GPTConfig(norm=name, norm_backend="triton")


def test_without_cuda_or_interpreter_fails_at_config_time(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailableError, match="needs a CUDA GPU \\(or TRITON_INTERPRET=1"):
        GPTConfig(norm_backend="triton")


def test_without_the_triton_package_the_message_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    with pytest.raises(BackendUnavailableError, match=r"needs the triton package: pip install 'resnorm-lm\[triton\]'"):
        TritonBackend.check_available()


@pytest.mark.parametrize("placement", ["postnorm", "prenorm", "sandwich", "deepnorm"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_placements_train_the_same_with_either_backend(placement, norm):
    cfg = dict(vocab_size=101, block_size=16, n_layer=3, n_head=2, n_embd=48, placement=placement, norm=norm)
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**cfg))
    fused = GPT(GPTConfig(**cfg, norm_backend="triton"))
    fused.load_state_dict(plain.state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in (plain, fused)]
    data = [(torch.randint(0, 101, (4, 16)), torch.randint(0, 101, (4, 16))) for _ in range(3)]
    for step, (idx, tgt) in enumerate(data):
        losses = []
        for model, opt in zip((plain, fused), opts):
            opt.zero_grad()
            _, loss = model(idx, tgt)
            loss.backward()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=1e-6), f"step {step}"
        for (name, p), q in zip(plain.named_parameters(), fused.parameters()):
            assert rel(q.grad, p.grad) < 1e-4, f"step {step}: {name}"
        for opt in opts:
            opt.step()


def test_kernel_benchmark_smoke_under_the_interpreter():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "benchmarks/bench_kernels.py"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "max |diff| vs torch" in proc.stdout
    env.pop("TRITON_INTERPRET")
    proc = subprocess.run([sys.executable, "benchmarks/bench_kernels.py"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and "no CUDA GPU" in proc.stdout

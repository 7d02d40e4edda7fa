"""The fused Triton Add & Norm kernels against the torch backend, under TRITON_INTERPRET=1 on CPU."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.norms import BackendUnavailableError, TritonBackend, build_norm
from tests.tolerances import assert_within_noise

pytest.importorskip("triton", reason="the triton extra is not installed")

CONFIGS = [("layernorm", True), ("layernorm", False), ("rmsnorm", False)]  # (norm, bias)


def pair(norm: str, n: int, bias: bool):
    """A triton-backend norm, a torch-backend twin with the same random parameters, and its fp64 copy."""
    fused, plain = build_norm(norm, n, backend="triton", bias=bias), build_norm(norm, n, bias=bias)
    with torch.no_grad():
        for p in fused.parameters():
            p.normal_(1.0, 0.3)
        plain.load_state_dict(fused.state_dict())
    return fused, plain, copy.deepcopy(plain).double()


def run_norm(module, x, d, dy, ds, dtype):
    """Outputs and gradients (inputs, then parameters) of ``norm`` or ``add_norm`` in ``dtype``."""
    x, d = x.detach().to(dtype).requires_grad_(), None if d is None else d.detach().to(dtype).requires_grad_()
    if d is None:
        outs = (module(x),)
        loss = (outs[0].to(dy.dtype) * dy).sum()
        inputs = [x]
    else:
        added = module.add_norm(x, d)
        outs = (added.normed, added.stream)
        loss = (outs[0].to(dy.dtype) * dy).sum() + (outs[1].to(ds.dtype) * ds).sum()
        inputs = [x, d]
    return outs, torch.autograd.grad(loss, inputs + list(module.parameters()))


def check_parity(norm, bias, rows, n, with_d, dtype, transpose=False):
    """The fused kernel within a few times the torch path's own error (same dtype, same inputs) of the exact answer."""
    fused, plain, exact = pair(norm, n, bias)
    shape = (n, rows) if transpose else (rows, n)
    x0 = (torch.randn(shape) * 2 + 0.3).to(dtype)
    d0 = torch.randn(shape).to(dtype) if with_d else None
    if transpose:  # non-contiguous inputs: (rows, n) views with stride 1 along rows
        x0, d0 = x0.t(), None if d0 is None else d0.t()
    # upstream gradients as a dtype path receives them: rounded to dtype (the same values on every side)
    dy, ds = torch.randn(rows, n).to(dtype).float(), torch.randn(rows, n).to(dtype).float()
    outs, grads = run_norm(fused, x0, d0, dy, ds, dtype)
    path_outs, path_grads = run_norm(plain, x0, d0, dy, ds, dtype)  # torch's own path in dtype
    exact_outs, exact_grads = run_norm(exact, x0, d0, dy.double(), ds.double(), torch.float64)
    for what, got, path, want in zip(["y", "sum"], outs, path_outs, exact_outs):
        assert got.dtype == dtype and got.shape == x0.shape, what
        assert_within_noise(got, path.to(dtype), want, f"forward {what} ({dtype})")
    names = ["dx", "dd"][: 1 + with_d] + [f"d{n}" for n, _ in fused.named_parameters()]
    for name, got, path, want in zip(names, grads, path_grads, exact_grads):
        assert got.shape == want.shape, name
        assert_within_noise(got, path.to(got.dtype), want, f"{name} ({dtype})")


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
    fused, plain, _ = pair("layernorm", 64, True)
    x = torch.randn(2, 9, 64, requires_grad=True)  # the fp32 stream
    d = torch.randn(2, 9, 64, dtype=torch.bfloat16, requires_grad=True)  # a bf16 sublayer output
    s, y = fused.add_norm(x, d)
    sr, yr = plain.add_norm(x, d)
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


@pytest.mark.parametrize("placement", ["postnorm", "prenorm", "sandwich", "deepnorm", "olmo2"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_placements_train_the_same_with_either_backend(placement, norm):
    """Along a few AdamW steps of an fp64 model, the fused model's loss and every gradient at the same
    weights stay within a few times the torch fp32 model's own error.

    All three models take the fp64 model's weights before each step: separate fp32 trajectories would
    part at once, because AdamW's first steps move each weight by about lr x sign(grad), so a rounding
    difference in a near-zero gradient becomes a difference of 2 x lr in a weight.
    """
    cfg = dict(vocab_size=101, block_size=16, n_layer=3, n_head=2, n_embd=48, placement=placement, norm=norm)
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**cfg))
    fused = GPT(GPTConfig(**cfg, norm_backend="triton"))
    exact = copy.deepcopy(plain).double()
    opt = torch.optim.AdamW(exact.parameters(), lr=3e-3)
    data = [(torch.randint(0, 101, (4, 16)), torch.randint(0, 101, (4, 16))) for _ in range(3)]
    for step, (idx, tgt) in enumerate(data):
        losses = []
        for model in (fused, plain, exact):
            model.load_state_dict(exact.state_dict())  # the fp64 weights, rounded to each model's dtype
            model.zero_grad()
            _, loss = model(idx, tgt)
            loss.backward()
            losses.append(loss.detach())
        assert_within_noise(losses[0], losses[1], losses[2], f"step {step}: loss")
        for (name, q), p, e in zip(fused.named_parameters(), plain.parameters(), exact.parameters()):
            assert_within_noise(q.grad, p.grad, e.grad, f"step {step}: {name}.grad")
        opt.step()


@pytest.mark.parametrize("placement", ["hc", "mhc", "attnres", "attnres_block", "denseformer"])
def test_the_designs_with_a_stream_of_their_own_run_on_the_fused_backend(placement):
    """Their norms are the configured norm's forward (no Add & Norm to fuse), so the fused backend covers them:
    the same logits and loss as torch at the same weights, to fp32 rounding. (Their gradients of scalars summed
    over every element, the HC gates and DenseFormer's weights, differ by more than the per-tensor noise floor of
    the test above: a sum of (B, T, C) products in two orders.)"""
    cfg = dict(vocab_size=101, block_size=16, n_layer=3, n_head=2, n_embd=48, placement=placement)
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**cfg))
    fused = GPT(GPTConfig(**cfg, norm_backend="triton"))
    fused.load_state_dict(plain.state_dict())
    idx, tgt = torch.randint(0, 101, (4, 16)), torch.randint(0, 101, (4, 16))
    torch.testing.assert_close(fused(idx)[0], plain(idx)[0], rtol=1e-5, atol=1e-5)
    (_, a), (_, b) = fused(idx, tgt), plain(idx, tgt)
    a.backward(), b.backward()
    for (name, q), p in zip(fused.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-6, msg=name)


@pytest.mark.training
def test_kernel_benchmark_smoke_under_the_interpreter():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_kernels.py"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "max |diff| vs torch" in proc.stdout
    env.pop("TRITON_INTERPRET")
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_kernels.py"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "no CUDA GPU" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_kernels.py", "--python-overhead", "--repeats", "1"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for path in ("fast path", "custom op", "torch eager"):
        assert proc.stdout.count(path) == 2, proc.stdout  # forward, forward + backward: figures, not asserted


def test_custom_operators_pass_opcheck():
    """Schema, fake tensors, autograd registration and dynamic-shape tracing of the three operators."""
    from resnorm_lm.model.kernels import add_norm_ops as ops

    x, d, dy = (torch.randn(5, 3, 16, requires_grad=True) for _ in range(3))
    w, b = torch.randn(16, requires_grad=True), torch.randn(16, requires_grad=True)
    for bias, is_rms in ((b, False), (None, False), (None, True)):
        torch.library.opcheck(ops.add_norm_fwd, (x, d, w, bias, 1e-5, is_rms, None))
        torch.library.opcheck(ops.norm_fwd, (x, w, bias, 1e-5, is_rms))
        _, s, mean, rstd = ops.add_norm_fwd(x, d, w, bias, 1e-5, is_rms, None)
        args = (dy.detach(), dy.detach(), s.detach(), w.detach(), None if bias is None else b.detach(), mean, rstd)
        torch.library.opcheck(ops.add_norm_bwd, (*args, is_rms, torch.float32))


@pytest.mark.training
@pytest.mark.parametrize("placement", ["prenorm", "postnorm"])
def test_torch_compile_traces_the_fused_kernels_with_dynamic_shapes(placement):
    """Compiled as one graph (fullgraph), then called with new batch shapes, as evaluation and generation
    do: the crash of issue 13 (Dynamo tracing the Triton launch with symbolic sizes) cannot come back."""
    cfg = GPTConfig(
        vocab_size=101, block_size=16, n_layer=2, n_head=2, n_embd=32, placement=placement, norm_backend="triton"
    )
    torch.manual_seed(0)
    model = GPT(cfg)
    compiled = torch.compile(model, backend="aot_eager", dynamic=True, fullgraph=True)
    for batch, length in ((4, 16), (3, 11), (1, 5)):  # a training batch, then evaluation batches
        idx, tgt = torch.randint(0, 101, (batch, length)), torch.randint(0, 101, (batch, length))
        _, loss = compiled(idx, tgt)  # the loss without logits (resnorm_lm/model/loss.py)
        _, ref_loss = model(idx, tgt)
        torch.testing.assert_close(loss, ref_loss)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        ref_grads = torch.autograd.grad(ref_loss, list(model.parameters()))
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r)
        with torch.no_grad():
            torch.testing.assert_close(compiled(idx)[0], model(idx)[0])


@pytest.mark.parametrize("is_rms, with_bias", [(False, True), (False, False), (True, False)])
def test_the_eager_fast_path_matches_the_operators(is_rms, with_bias):
    """Eager calls skip the operator dispatch (host time per call) and must give the operators' results,
    also when only one of (y, s) is used downstream (its gradient then arrives as None)."""
    from resnorm_lm.model.kernels import add_norm_ops as ops

    torch.manual_seed(0)
    x, d = torch.randn(2, 7, 48, requires_grad=True), torch.randn(2, 7, 48, requires_grad=True)
    w = torch.randn(48, requires_grad=True)
    b = torch.randn(48, requires_grad=True) if with_bias else None
    params = [t for t in (x, d, w, b) if t is not None]
    s, y = ops.add_norm(x, d, w, b, 1e-5, is_rms)
    assert type(y.grad_fn).__name__ == "_AddNormFunctionBackward"
    y_op, s_op, _, _ = ops.add_norm_fwd(x, d, w, b, 1e-5, is_rms, None)
    torch.testing.assert_close(y, y_op)
    torch.testing.assert_close(s, s_op)
    for use in (lambda y, s: (y * y).sum(), lambda y, s: (s * s).sum(), lambda y, s: (y * s).sum()):
        s_fast, y_fast = ops.add_norm(x, d, w, b, 1e-5, is_rms)
        fast = torch.autograd.grad(use(y_fast, s_fast), params)
        slow = torch.autograd.grad(use(y_op, s_op), params, retain_graph=True)
        for got, want in zip(fast, slow):
            torch.testing.assert_close(got, want)
    plain = ops.norm(x, w, b, 1e-5, is_rms)
    plain_op = ops.norm_fwd(x, w, b, 1e-5, is_rms)[0]
    torch.testing.assert_close(plain, plain_op)
    no_d = [t for t in (x, w, b) if t is not None]
    for got, want in zip(
        torch.autograd.grad(plain.pow(2).sum(), no_d), torch.autograd.grad(plain_op.pow(2).sum(), no_d)
    ):
        torch.testing.assert_close(got, want)


@pytest.fixture(scope="module")
def probe():
    """tests/triton_op_probe.py's findings, run once without TRITON_INTERPRET (it needs no GPU)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "tests/triton_op_probe.py"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.training
@pytest.mark.parametrize("config", ["heuristic", "autotuned"])
def test_compiled_graphs_launch_the_kernels_themselves_with_symbolic_rows(probe, config):
    """Outside the interpreter the operators are ``triton_op``s: traced as Inductor traces them (meta tensors,
    Inductor's decompositions and partitioner), forward and backward graphs hold the kernel launches
    (``triton_kernel_wrapper_functional``, which Inductor turns into generated launch code), not opaque
    operator calls into Python, and three row counts share one forward and one backward graph; with the
    heuristic launch configuration and with triton.autotune's (the GPU's)."""
    import re

    forward, backward = probe["graphs"][config]  # two graphs for three row counts: no recompilation
    for graph, kernel in ((forward, "_add_norm_fwd"), (backward, "_add_norm_bwd")):
        launches = re.findall(r"triton_kernel_wrapper_functional\(kernel_idx = (\d+)", graph)
        assert [probe["kernels"][i] for i in launches] == [kernel, kernel], graph  # add & LayerNorm, RMSNorm
        assert "resnorm_lm" not in graph, graph  # no opaque operator left
        assert re.search(r"'M': primals_\d+", graph), "the row count must stay a symbol, not a constant"
    assert re.search(r"grid = \[\(floordiv", forward)  # cdiv(rows, BLOCK_M) programs, from the symbolic rows


@pytest.mark.training
def test_backward_accumulates_dw_db_in_2d_and_reduces_rows_once(probe):
    """In the backward's TTIR (768 wide: BLOCK_N 1024, 4-row tiles), the loop over row tiles carries the dW and
    dB partials as (4, 1024) fp32 tiles and reduces only within rows (to 4 values); the reduction across rows
    (to 1024 values) comes once, after the loop, instead of a cross-warp reduction on every tile."""
    lines = probe["backward_ttir"].splitlines()
    start = next(i for i, line in enumerate(lines) if "scf.for" in line)
    end = next(i for i in range(start, len(lines)) if "scf.yield" in lines[i])
    assert "iter_args" in lines[start] and lines[start].count("tensor<4x1024xf32>") >= 2, lines[start]
    sums = [line for line in lines[start:end] if ".sum" in line and "tt.call" in line]
    assert sums and all("-> tensor<4xf32>" in line for line in sums), "\n".join(sums)
    after = [line for line in lines[end:] if ".sum" in line and "tt.call" in line and "-> tensor<1024xf32>" in line]
    assert len(after) == 2, "dW and dB: one cross-row reduction each, after the loop"


@pytest.mark.parametrize("norm, bias", [("layernorm", True), ("rmsnorm", False)], ids=["ln", "rms"])
def test_backward_walks_several_row_tiles_per_program_deterministically(norm, bias):
    """1100 rows of 96 are 9 tiles of 128 rows for 4 programs: programs walk 3, 2, 2 and 2 tiles, the last one
    partial. Gradients match torch's, and the same inputs give the same bits twice (fixed summation order)."""
    check_parity(norm, bias, 1100, 96, True, torch.float32)
    fused, _, _ = pair(norm, 96, bias)
    x, d, dy, ds = (torch.randn(1100, 96) for _ in range(4))
    first, second = (run_norm(fused, x, d, dy, ds, torch.float32)[1] for _ in range(2))
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_the_same_tensor_as_stream_and_sublayer_output():
    """``add_norm(x, x)`` adds, and one gradient tensor reaching both y and s (as ``autograd.backward([y, s],
    [g, g])`` sends it) counts twice: the kernels' flags come from what was passed, not from tensor identity."""
    from resnorm_lm.model.kernels import add_norm_ops as ops

    x = torch.randn(6, 40, requires_grad=True)
    w, b, g = torch.randn(40), torch.randn(40), torch.randn(6, 40)
    s, y = ops.add_norm(x, x, w, b, 1e-5, False)
    torch.testing.assert_close(s, 2 * x)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(2 * x, (40,), w, b, 1e-5))
    torch.autograd.backward([y, s], [g, g])
    ref = x.detach().requires_grad_()
    yr = torch.nn.functional.layer_norm(2 * ref, (40,), w, b, 1e-5)
    torch.autograd.backward([yr, 2 * ref], [g, g])
    torch.testing.assert_close(x.grad, ref.grad)


def test_autotune_only_on_a_gpu_with_a_handful_of_configs_per_width(monkeypatch):
    """The interpreter, a CPU tensor, and torch.use_deterministic_algorithms keep the fixed heuristic; a GPU
    outside them autotunes among a few configs per width whose tiles fit the registers."""
    import triton

    from resnorm_lm.model.kernels import add_norm as k

    assert not k._autotuning(torch.device("cpu"))
    assert not k._autotuning(torch.device("cuda"))  # the interpreter is on in the tests
    monkeypatch.setattr(k, "INTERPRETING", False)
    assert k._autotuning(torch.device("cuda")) and not k._autotuning(torch.device("cpu"))
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert not k._autotuning(torch.device("cuda"))
    for tuned, tile in ((k._add_norm_fwd_tuned, k.FWD_TILE), (k._add_norm_bwd_tuned, k.BWD_TILE)):
        for n in (768, 1024, 2048, 4096, 8192):
            block_n = triton.next_power_of_2(n)
            configs = tuned.early_config_prune(tuned.configs, {}, BLOCK_N=block_n)
            assert 2 <= len(configs) <= 6, (n, configs)
            for c in configs:
                elements = c.kwargs["BLOCK_M"] * block_n
                assert elements <= max(tile[1], block_n) and 16 <= elements // (32 * c.num_warps) <= 32, (n, c)


def test_eager_calls_launch_autotunes_pick_directly_after_the_first(monkeypatch):
    """After an autotuned kernel has picked its config for a width and variant, eager calls launch the plain
    kernel with that config (same results), skipping the Autotuner's per-call work. The interpreter cannot
    time configs, so the Autotuner here has one config (it then picks without timing)."""
    import triton

    from resnorm_lm.model.kernels import add_norm as k

    block_m, _, num_warps = k.heuristic(96, 4, False)
    tuned = triton.autotune([triton.Config({"BLOCK_M": block_m}, num_warps=num_warps)], key=["N"])(k._add_norm_fwd)
    runs = []
    real_run = tuned.run
    monkeypatch.setattr(tuned, "run", lambda *a, **kw: runs.append(1) or real_run(*a, **kw))
    monkeypatch.setattr(k, "_add_norm_fwd_tuned", tuned)
    monkeypatch.setattr(k, "_autotuning", lambda device: True)
    monkeypatch.setattr(k, "_PICKED", {})
    merged = []  # the pick's launch keywords are merged once, when it is picked, not on every call
    real_all_kwargs = triton.Config.all_kwargs
    monkeypatch.setattr(triton.Config, "all_kwargs", lambda c: merged.append(1) or real_all_kwargs(c))
    k._launch.cache_clear()
    try:
        x, d, w, b = torch.randn(10, 96), torch.randn(10, 96), torch.randn(96), torch.randn(96)
        want = torch.nn.functional.layer_norm(x + d, (96,), w, b, 1e-5)
        for _ in range(3):
            y, s, _, _ = k.add_norm_forward(x, d, w, b, 1e-5, False)
            torch.testing.assert_close(y, want)
            torch.testing.assert_close(s, x + d)
        assert len(runs) == 1  # the Autotuner ran once; then its pick, directly
        calls_after_pick = len(merged)
        k.add_norm_forward(x, d, w, b, 1e-5, False)
        assert len(merged) == calls_after_pick  # a direct launch merges nothing
        assert len(k._PICKED) == 1
    finally:
        k._launch.cache_clear()

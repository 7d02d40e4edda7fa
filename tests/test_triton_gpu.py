"""The fused Triton kernels on a real GPU: autotuned launches, triton_op under Inductor, parity, determinism.

Skipped without CUDA or under the interpreter (so always in CI). benchmarks/gpu_session.sh runs it as

    TRITON_INTERPRET=0 CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q tests/test_triton_gpu.py
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from tests.tolerances import assert_within_noise

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU, with TRITON_INTERPRET unset or 0",
)
CASES = [(False, True), (False, False), (True, False)]  # (is_rms, bias)


def inputs(rows, n, dtype, bias, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, d = (torch.randn(rows, n, device="cuda", generator=g).to(dtype).requires_grad_() for _ in range(2))
    w = (1 + 0.3 * torch.randn(n, device="cuda", generator=g)).requires_grad_()  # fp32 parameters, as under autocast
    b = (0.3 * torch.randn(n, device="cuda", generator=g)).requires_grad_() if bias else None
    dy, ds = (torch.randn(rows, n, device="cuda", generator=g).to(dtype) for _ in range(2))
    return x, d, w, b, dy, ds


def torch_add_norm(x, d, w, b, is_rms):
    s = x + d
    y = (
        F.rms_norm(s, s.shape[-1:], w.to(s.dtype), 1e-5)
        if is_rms
        else F.layer_norm(s, s.shape[-1:], w.to(s.dtype), None if b is None else b.to(s.dtype), 1e-5)
    )
    return s, y


def grads(fn, x, d, w, b, dy, ds):
    s, y = fn(x, d, w, b)
    leaves = [t for t in (x, d, w, b) if t is not None]
    return (y, s, *torch.autograd.grad([y, s], leaves, [dy.to(y.dtype), ds.to(s.dtype)]))


@pytest.mark.parametrize("n", [768, 1000, 4096, 8192])
@pytest.mark.parametrize("is_rms, bias", CASES, ids=["ln", "ln-nobias", "rms"])
def test_bf16_parity_and_determinism(is_rms, bias, n):
    """Autotuned kernels against torch's bf16 path, both against fp64; the same inputs give the same bits twice."""
    from resnorm_lm.model.kernels import add_norm_ops as ops

    args = inputs(4096 + 3, n, torch.bfloat16, bias)
    fused = grads(lambda x, d, w, b: ops.add_norm(x, d, w, b, 1e-5, is_rms), *args)
    again = grads(lambda x, d, w, b: ops.add_norm(x, d, w, b, 1e-5, is_rms), *args)
    path = grads(lambda x, d, w, b: torch_add_norm(x, d, w, b, is_rms), *args)
    exact_args = [None if t is None else t.detach().double().requires_grad_() for t in args[:4]] + list(args[4:])
    exact = grads(lambda x, d, w, b: torch_add_norm(x, d, w, b, is_rms), *exact_args)
    for i, (got, twice, ref, want) in enumerate(zip(fused, again, path, exact)):
        assert torch.equal(got, twice), f"output {i} differs between two identical calls"
        assert_within_noise(got, ref, want, f"output {i} (n={n})")


def test_operators_pass_opcheck_on_the_gpu():
    """triton_op schema, fake tensors, autograd registration and AOT dispatch, on CUDA tensors."""
    from resnorm_lm.model.kernels import add_norm_ops as ops

    for is_rms, bias in CASES:
        x, d, w, b, dy, _ = inputs(37, 768, torch.float32, bias)
        torch.library.opcheck(ops.add_norm_fwd, (x, d, w, b, 1e-5, is_rms, None))
        torch.library.opcheck(ops.norm_fwd, (x, w, b, 1e-5, is_rms))
        _, s, mean, rstd = ops.add_norm_fwd(x, d, w, b, 1e-5, is_rms, None)
        detached = [None if t is None else t.detach() for t in (dy, dy, s, w, b)]
        torch.library.opcheck(ops.add_norm_bwd, (*detached, mean, rstd, is_rms, torch.float32))


@pytest.mark.parametrize("placement", ["prenorm", "postnorm"])
def test_inductor_launches_the_kernels_and_keeps_dynamic_shapes(placement):
    """Inductor's generated code launches the Triton kernels itself (no call into resnorm_lm's operators), the
    compiled model matches eager, and a third batch shape reuses the dynamic graph (no recompile)."""
    from torch._inductor.utils import run_and_get_code

    from resnorm_lm.model.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=101, block_size=64, n_layer=2, n_head=2, n_embd=64, placement=placement, norm_backend="triton"
    )
    model = GPT(cfg).cuda()
    compiled = torch.compile(model)
    torch._dynamo.reset()
    for step, (batch, length) in enumerate(((4, 64), (3, 37), (2, 50))):
        idx, tgt = (torch.randint(0, 101, (batch, length), device="cuda") for _ in range(2))
        with torch._dynamo.config.patch(error_on_recompile=step == 2):
            (_, loss), code = run_and_get_code(compiled, idx, tgt)  # the loss without logits
        if step == 0:
            source = "\n".join(code)
            assert "_add_norm_fwd" in source and "resnorm_lm.add_norm_fwd" not in source
        _, ref_loss = model(idx, tgt)
        torch.testing.assert_close(loss, ref_loss, atol=2e-4, rtol=2e-4)
        got = torch.autograd.grad(loss, list(model.parameters()))
        want = torch.autograd.grad(ref_loss, list(model.parameters()))
        for g, r in zip(got, want):
            torch.testing.assert_close(g, r, atol=2e-4, rtol=2e-3)

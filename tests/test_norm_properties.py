"""Property-based tests of the norms (hypothesis): random shapes, scales 1e-6..1e6, constant rows, bf16."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from resnorm_lm.norms import NORMS, build_norm
from tests.test_norms import fp64_twin, reference

shapes = st.tuples(st.integers(1, 6), st.integers(1, 130))
scales = st.sampled_from([1e-6, 1e-3, 1.0, 1e3, 1e6])


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(NORMS.names()), shape=shapes, scale=scales, seed=st.integers(0, 2**16),
       constant=st.booleans(), bf16=st.booleans())  # fmt: skip
def test_norms_are_finite_and_match_the_reference(name, shape, scale, seed, constant, bf16):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    if constant:
        x = torch.full(shape, scale, dtype=torch.float64)
    norm = build_norm(name, shape[-1])
    twin = fp64_twin(norm, name, shape[-1], True)
    dtype = torch.bfloat16 if bf16 else torch.float32
    inp = x.to(dtype)
    y = norm.to(dtype)(inp)
    assert torch.isfinite(y).all(), f"{name}: non-finite output at scale {scale}"
    want = reference(twin, inp.double())  # the same rounded input
    tol = 3e-2 if bf16 else 1e-4
    err = (y.double() - want).abs().max().item()
    # relative to the output's own size: a norm's output is O(1) (O(|x|) for none and DyT's linear range)
    assert err <= tol * max(1.0, want.abs().max().item()), f"{name}: max error {err:.3g} (scale {scale})"

"""Tolerances from the arithmetic, not from one machine.

An implementation under test is compared with an exact (fp64) reference, and
allowed a small multiple of the error that a plain reference path makes on the
same inputs in the same precision (its noise floor): a kernel library that
rounds differently on another CPU moves both errors together, so the test
checks the code, not the machine.
"""

from __future__ import annotations

import torch

FACTOR = 4.0  # how far above the reference path's own error an implementation may be


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the spacing of floats at 1.0: the relative error of rounding one number to ``dtype``."""
    return torch.finfo(dtype).eps / 2


def relative_error(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-30) -> float:
    """||a - b|| / max(||b||, floor), in fp64."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(floor)).item()


def noise_floor(
    path: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype, floor: float = 1e-30, terms: int = 1
) -> float:
    """The error a reference ``path`` in ``dtype`` makes against ``exact``, and never below the error of
    rounding the exact answer to ``dtype``, nor below sqrt(``terms``) unit roundoffs: the typical error of a sum
    of ``terms`` numbers, which a path that sums in another order (another CPU's vector width) makes even where
    the reference path happened to round luckily."""
    rounding = relative_error(exact.to(dtype), exact, floor)
    return max(relative_error(path, exact, floor), rounding, terms**0.5 * unit_roundoff(dtype))


def assert_within_noise(
    got: torch.Tensor,
    path: torch.Tensor,
    exact: torch.Tensor,
    what: str = "",
    floor: float = 1e-30,
    factor: float = FACTOR,
    terms: int = 1,
) -> None:
    """``got`` is within ``factor`` x the reference path's own error of the exact answer (``terms``: how many
    numbers each entry of it sums)."""
    err = relative_error(got, exact, floor)
    limit = factor * noise_floor(path, exact, got.dtype, floor, terms)
    assert err <= limit, f"{what}: relative error {err:.3g} > {factor:g} x noise floor ({limit / factor:.3g})"

"""``Trainer``: Lightning's Trainer whose precision may also be ``auto`` (see ``resnorm_lm.train.precision``)."""

from __future__ import annotations

import lightning as L

from resnorm_lm.train.precision import AUTO, resolve_precision, set_matmul_precision_for, uses_cuda


class Trainer(L.Trainer):
    """``L.Trainer`` plus ``precision: auto`` (the default) and TF32 matmuls on CUDA.

    Args:
        precision: ``auto`` (the fastest of bf16-mixed and 32-true that this hardware really runs fast,
            measured; bf16-mixed or 16-mixed on CUDA) or any precision Lightning accepts.
        *args, **kwargs: everything else, as for ``lightning.Trainer``.
    """

    def __init__(self, *args, precision: str | int | None = AUTO, **kwargs) -> None:
        cuda = uses_cuda(kwargs.get("accelerator", "auto"))
        self.precision_choice = resolve_precision(precision, cuda)
        set_matmul_precision_for(cuda)
        super().__init__(*args, precision=self.precision_choice.precision, **kwargs)

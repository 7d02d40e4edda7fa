"""Measurements behind the post-norm vs pre-norm argument (Xiong et al. 2020)."""

from __future__ import annotations

import torch
from torch import nn

from resnorm_lm.model.gpt import GPT


def per_layer_grad_norms(model: GPT) -> list[float]:
    """The L2 norm of the gradient of each block's weight matrices, block 0 (input side) first.

    Matrices only (attention and MLP weights): the quantity Xiong et al. plot per layer.
    Call after ``backward()``.
    """
    return grad_norms(model)[1]


def grad_norms(model: GPT) -> tuple[float, list[float]]:
    """The total gradient norm (every parameter) and ``per_layer_grad_norms``, read back in one host sync."""
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0, [0.0] * len(model.blocks)
    total = l2_norm(grads)
    per_layer = [
        l2_norm([p.grad.detach() for p in block.parameters() if p.ndim == 2 and p.grad is not None])
        for block in model.blocks
    ]
    values = torch.stack([total, *(n.to(total.device) for n in per_layer)]).tolist()  # (1 + L,): the one sync
    return values[0], values[1:]


def l2_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all ``tensors`` together, in fp32, on their device (0-dim); 0 for none."""
    if not tensors:
        return torch.zeros((), dtype=torch.float32)
    # one kernel per dtype and device instead of one per tensor
    return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32)).norm()


def grad_norms_at_init(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """Per-layer gradient norms of one backward pass of ``model`` on a batch (B, T) at its current weights."""
    model.zero_grad(set_to_none=True)
    _, loss = model(idx, targets)
    loss.backward()
    return per_layer_grad_norms(model)


class StreamRMS:
    """The RMS of the residual stream leaving each block (the growth with depth that LayerNorm Scaling sets out
    to curb: Sun et al. 2025, Fig. 1), read by forward hooks on the blocks in the forward passes run while
    ``active``. The hooks stay registered (a compiled model guards on ``active`` and keeps one graph for each
    value); inactive, they do nothing."""

    def __init__(self, model: GPT) -> None:
        self.active = False
        self.values: list[torch.Tensor] = []  # 0-dim fp32, on the device: n_layer per forward pass
        self.n_layer = len(model.blocks)
        residual = model.stream.residual
        for block in model.blocks:
            block.register_forward_hook(self._hook(residual))

    def _hook(self, residual):
        def record(block: nn.Module, args: tuple, stream) -> None:
            if self.active:
                self.values.append(residual(stream).detach().float().square().mean().sqrt())

        return record

    def take(self) -> list[torch.Tensor]:
        """Per block (block 0 first), the RMS averaged over the forward passes recorded since the last take
        (the micro-batches of one step); empty if none were. Device tensors: read them back in one sync."""
        values, self.values = self.values, []
        if not values:
            return []
        per_pass = torch.stack(values).view(-1, self.n_layer)  # (passes, n_layer)
        return list(per_pass.mean(0).unbind())

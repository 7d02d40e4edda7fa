"""Measurements behind the post-norm vs pre-norm argument (Xiong et al. 2020)."""

from __future__ import annotations

import torch

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
    per_layer = [l2_norm([p.grad.detach() for p in block.parameters() if p.ndim == 2 and p.grad is not None])
                 for block in model.blocks]  # fmt: skip
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

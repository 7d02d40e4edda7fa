"""Measurements behind the post-norm vs pre-norm argument (Xiong et al. 2020)."""

from __future__ import annotations

import torch

from resnorm_lm.model import GPT


def per_layer_grad_norms(model: GPT) -> list[float]:
    """The L2 norm of the gradient of each block's weight matrices, block 0 (input side) first.

    Matrices only (attention and MLP weights): the quantity Xiong et al. plot per layer.
    Call after ``backward()``.
    """
    norms = []
    for block in model.blocks:
        squares = [
            p.grad.detach().float().pow(2).sum() for p in block.parameters() if p.ndim == 2 and p.grad is not None
        ]
        norms.append(torch.stack(squares).sum().sqrt().item() if squares else 0.0)
    return norms


def grad_norms_at_init(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """Per-layer gradient norms of one backward pass of ``model`` on a batch (B, T) at its current weights."""
    model.zero_grad(set_to_none=True)
    _, loss = model(idx, targets)
    loss.backward()
    return per_layer_grad_norms(model)

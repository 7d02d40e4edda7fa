"""The LM head and its cross-entropy in one pass over row chunks, without the (N, V) logits in memory.

``F.cross_entropy(F.linear(h, W))`` writes the fp32 logits, their log-softmax, a zero-filled gradient of
the same size and the log-softmax's gradient: four passes over an (N, V) tensor (at the cpu profile 2048 x
8192, 64 MiB each), which on a CPU cost more than the head's matmuls (docs/benchmarks.md). Here each chunk
of rows is projected, its log-sum-exp and loss taken, and, when a gradient is needed, the gradient of the
chunk's logits (softmax minus one-hot) is formed in place and multiplied into the gradients of ``h`` and
``W`` at once, while the chunk is still in cache: the "fused linear cross entropy" of Liger-Kernel
(``src/liger_kernel/ops/fused_linear_cross_entropy.py``, after mgmalek/efficient_cross_entropy), here in
PyTorch ops. The backward only scales the stored gradients by the incoming one.

The arithmetic is autocast's: under autocast the matmuls run in its dtype (bf16 logits, as ``F.linear``
would give), and the softmax, the loss and the gradient of the logits are fp32. The gradient of ``W`` is
summed over chunks in fp32. Under ``torch.compile`` the plain formula is used: Inductor fuses it itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from resnorm_lm.targets import IGNORE_INDEX

CHUNK_ELEMENTS = 1 << 20  # logits per chunk on a CPU: 4 MiB of fp32, about a core's L2 (rows = this // V, >= 1)
GPU_CHUNK_ELEMENTS = 1 << 27  # elsewhere 512 MiB of fp32: a few large chunks, not thousands of small launches


def linear_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy of ``h @ weight.T`` against ``targets``, targets equal to ``IGNORE_INDEX`` skipped.

    h: (N, C) hidden states; weight: (V, C) the LM head; targets: (N,) token ids.
    reduction: ``mean`` over the counted targets, or ``sum``. Returns a 0-dim fp32 tensor.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if torch.compiler.is_compiling():
        logits = F.linear(h, weight).float()  # (N, V)
        return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction=reduction)
    device = h.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.result_type(h, weight)
    rows = max(1, (CHUNK_ELEMENTS if device == "cpu" else GPU_CHUNK_ELEMENTS) // weight.shape[0])
    # needs_input_grad says only whether the inputs require grad, also under no_grad (evaluation)
    return LinearCrossEntropy.apply(h, weight, targets, reduction, dtype, rows, torch.is_grad_enabled())


class LinearCrossEntropy(torch.autograd.Function):
    """Forward: the loss, and the gradients of ``h`` and ``weight`` for a loss gradient of one; backward: scaled."""

    @staticmethod
    def forward(ctx, h, weight, targets, reduction, dtype, rows, grad_enabled):  # noqa: D102 (on the class)
        needs_grad = [grad_enabled and needed for needed in ctx.needs_input_grad[:2]]
        with torch.autocast(h.device.type, enabled=False):  # every cast below is explicit
            loss, grad_h, grad_w = _chunked(h, weight, targets, reduction, dtype, rows, needs_grad)
        ctx.save_for_backward(grad_h, grad_w)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):  # noqa: D102
        grad_h, grad_w = ctx.saved_tensors
        grad_h = grad_h * grad_loss if ctx.needs_input_grad[0] else None
        grad_w = grad_w * grad_loss if ctx.needs_input_grad[1] else None
        return grad_h, grad_w, None, None, None, None, None


def _chunked(h, weight, targets, reduction, dtype, rows, needs_grad):
    """The loss (fp32, 0-dim) and, where ``needs_grad`` says, d loss / d h (N, C) and d loss / d weight (V, C)."""
    counted = targets != IGNORE_INDEX  # (N,)
    # mean over no counted target is 0/0 = nan, as in F.cross_entropy
    scale = 1.0 / counted.sum() if reduction == "mean" else torch.ones((), device=h.device)
    w = weight.to(dtype)  # (V, C): cast once, not once per chunk
    loss = torch.zeros((), dtype=torch.float32, device=h.device)
    grad_h = torch.empty_like(h) if needs_grad[0] else None  # (N, C)
    grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if needs_grad[1] else None  # (V, C)
    for start in range(0, h.shape[0], rows):
        hc = h[start : start + rows].to(dtype)  # (R, C)
        ok = counted[start : start + rows]  # (R,)
        target = torch.where(ok, targets[start : start + rows], 0)  # (R,): ignored rows point at token 0
        logits = (hc @ w.T).float()  # (R, V)
        lse = torch.logsumexp(logits, dim=1)  # (R,)
        picked = logits.gather(1, target[:, None]).squeeze(1)  # (R,)
        loss += torch.where(ok, lse - picked, 0.0).sum()
        if grad_h is None and grad_w is None:
            continue
        grad = logits.sub_(lse[:, None]).exp_()  # (R, V) softmax, in place of the logits
        grad[torch.arange(len(target), device=h.device), target] -= 1.0
        grad *= (ok * scale)[:, None]  # ignored rows get no gradient
        grad = grad.to(dtype)
        if grad_h is not None:
            grad_h[start : start + rows] = grad @ w  # (R, C)
        if grad_w is not None:
            if dtype == torch.float32:
                grad_w.addmm_(grad.T, hc)  # (V, C)
            else:
                grad_w += (grad.T @ hc).float()  # (V, C): the product in autocast's dtype, the sum in fp32
    loss = loss * scale if reduction == "mean" else loss
    grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
    return loss, grad_h, grad_w

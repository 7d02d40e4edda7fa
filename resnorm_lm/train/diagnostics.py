"""What a run measures of itself besides its loss: per-layer gradient norms, the residual stream's RMS after each
block, each attention's largest logit, and how often the gradient clip binds."""

from __future__ import annotations

import math

import torch
from torch import nn

from resnorm_lm.model.gpt import GPT
from resnorm_lm.model.layers import CausalSelfAttention

# The columns of metrics.csv that the LightningModule logs (one name each, here; read back through RunDir)
TRAIN_LOSS = "train/loss"
VAL_LOSS = "val/loss"
TRAIN_SECONDS = "time/train_s"  # training wall time so far, this run's segments together
GRAD_NORM_TOTAL = "grad_norm/total"  # the global gradient norm, before clipping
CLIP_BOUND = "clip/bound"  # 1 where this step's clip bound (torch's rule)
CLIP_FRACTION = "clip/fraction"  # the fraction of the steps before this one whose clip bound
GRAD_NORMS = "grad_norm/layer_"  # + the block's index (2 digits): the gradient norm of its matrices, before clipping
STREAM_RMS = "stream_rms/layer_"  # + the block's index: the RMS of the residual stream leaving it
READOUT_MEAN_RMS = "readout/mean_rms"  # the RMS of the final norm's input's mean over the batch's tokens (C,)
READOUT_REST_RMS = "readout/rest_rms"  # the RMS of what is left of that input when its mean is taken away
ATTN_LOGIT_MAX = "attn_logit_max/layer_"  # + the attention's index: its largest causal |q.k|/sqrt(head_dim)
# The optimizer step the diagnostics above were measured at (the steps a multiple of log_every_n_steps: the first is
# the initialization). Lightning writes them on its next logging row, whose ``step`` is log_every_n_steps - 1 later.
DIAGNOSTICS_STEP = "diagnostics/step"


def block_column(prefix: str, block: int) -> str:
    """``block_column(GRAD_NORMS, 7)`` -> ``grad_norm/layer_07``: a per-block metric's column."""
    return f"{prefix}{block:02d}"


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


def causal_logits(q: torch.Tensor, k: torch.Tensor, n_head: int) -> torch.Tensor:
    """The attention logits ``z_ij = q_i . k_j / sqrt(head_dim)`` of queries and keys (B, T, C) split into
    ``n_head`` heads, in fp64 where the inputs are (else fp32), (B, n_head, T, T): row i a query, column j a key.
    The causal mask is the caller's (``torch.ones(T, T).tril()``: j <= i)."""
    B, T, C = q.shape
    hs = C // n_head
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k = (t.view(B, T, n_head, hs).transpose(1, 2).to(dtype) for t in (q, k))  # (B, nh, T, hs)
    return q @ k.transpose(-2, -1) / math.sqrt(hs)


class AttentionLogitMax:
    """Each attention's largest causal logit ``|z_ij|`` (j <= i) over its heads and the batch's positions, read by
    forward hooks on its QK-norm (what the softmax is handed: the projections themselves without one) in the
    forward passes run while ``active``: the "attention logit growth" that Dehghani et al. (2023) saw diverge
    ViT-22B and Wortsman et al. (2023) reproduce in small models at high learning rates, logged as training goes
    (``resnorm-lm attention-logits`` measures it, with the heads' entropy, at a run's final weights)."""

    def __init__(self, model: GPT) -> None:
        self.active = False
        self.values: list[torch.Tensor] = []  # 0-dim fp32, on the device: one per attention per forward pass
        attentions = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
        self.n_attention = len(attentions)
        self.n_head = model.config.n_head
        for attention in attentions:
            attention.qk_norm.register_forward_hook(self._record)

    def _record(self, module: nn.Module, args: tuple, out: tuple[torch.Tensor, torch.Tensor]) -> None:
        if self.active:
            q, k = (t.detach() for t in out)  # (B, T, C) each
            T = q.shape[1]
            causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # (T, T): j <= i
            # a window at a time: (nh, T, T) logits, not (B, nh, T, T) at once (GPT-2's context is 1024)
            per_window = [
                causal_logits(q[b : b + 1], k[b : b + 1], self.n_head).abs().masked_fill(~causal, 0.0).amax()
                for b in range(q.shape[0])
            ]
            self.values.append(torch.stack(per_window).amax())

    def take(self) -> list[torch.Tensor]:
        """Per attention (in the model's order: block 0 first), the largest over the forward passes recorded since
        the last take (the micro-batches of one step); empty if none were. Device tensors: read them back in one
        sync."""
        values, self.values = self.values, []
        if not values:
            return []
        per_pass = torch.stack(values).view(-1, self.n_attention)  # (passes, n_attention)
        return list(per_pass.amax(0).unbind())


# ---------------------------------------------------------------------------------------------------------------------
# Gradient clipping by global norm, with a record of how often it bound.
#
# Clipping at 1.0 binds for one placement and hardly for another (a step-0 gradient norm of about 1 per block
# under pre-norm, about 0.03 under post-norm), so the early effective step differs by placement. The record says
# how often it did: the steps taken and the steps whose pre-clip global norm exceeded the bound, counted on the
# gradients' device (no host sync per step) and kept in checkpoints, so a resumed run counts on.


class ClipRecord:
    """Counts of optimizer steps with clipping on, and of those whose pre-clip norm exceeded the bound."""

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None  # (2,) int64 on the gradients' device: [steps, clipped steps]
        self.max_norm: float | None = None  # the bound of the last recorded step

    def clip(self, params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
        """Clip the gradients of ``params`` to global norm ``max_norm`` (torch's rule) and record the step; returns
        the pre-clip norm (0-dim, on the device)."""
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        # torch scales by max_norm / (total + 1e-6) where that is below 1: the clip binds where total exceeds this
        bound = (total + 1e-6 > max_norm).long()
        step = torch.stack([torch.ones_like(bound), bound])  # (2,)
        self.counts = step if self.counts is None else self.counts.to(step.device) + step  # .to: once, after a load
        self.max_norm = float(max_norm)
        return total

    def summary(self) -> dict | None:
        """``{"max_norm", "steps", "clipped_steps", "clipped_fraction"}`` (one host read), or None where no step
        was clipped by norm."""
        if self.counts is None:
            return None
        steps, clipped = self.counts.tolist()
        return {
            "max_norm": self.max_norm,
            "steps": steps,
            "clipped_steps": clipped,
            "clipped_fraction": clipped / steps if steps else 0.0,
        }

    def state_dict(self) -> dict:
        return {"counts": None if self.counts is None else self.counts.cpu().tolist(), "max_norm": self.max_norm}

    def load_state_dict(self, state: dict) -> None:
        counts = state.get("counts")
        self.counts = None if counts is None else torch.tensor(counts, dtype=torch.long)
        self.max_norm = state.get("max_norm")


class ReadoutMean:
    """The final norm's input split into its token-constant part (its mean over every token of the batch, (C,))
    and the rest, the RMS of each, read by a forward pre-hook on the final norm in the forward passes run while
    ``active``. A stream whose growth is all in a mean that every token shares (the residual biases pushed the
    same way by the unigram gradient) saturates a tanh readout (DyT's) while carrying nothing that tells tokens
    apart: the two numbers say which way a stream grew."""

    def __init__(self, model: GPT) -> None:
        self.active = False
        self.values: list[torch.Tensor] = []  # (2,) fp32 per forward pass: [mean's RMS, rest's RMS]
        model.stream.final_norm.register_forward_pre_hook(self._record)

    def _record(self, module: nn.Module, args: tuple) -> None:
        if self.active:
            x = args[0].detach().float()  # (B, T, C)
            mean = x.mean(dim=(0, 1))  # (C,): what every token shares
            rest = x - mean  # (B, T, C)
            self.values.append(torch.stack([mean.square().mean().sqrt(), rest.square().mean().sqrt()]))

    def take(self) -> dict[str, torch.Tensor]:
        """The two RMS values averaged over the forward passes recorded since the last take, by column."""
        values, self.values = self.values, []
        if not values:
            return {}
        mean_rms, rest_rms = torch.stack(values).mean(0).unbind()
        return {READOUT_MEAN_RMS: mean_rms, READOUT_REST_RMS: rest_rms}

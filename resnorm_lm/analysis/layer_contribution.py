"""Layer contribution: how much each block of a trained model does (the curse-of-depth measurement).

For each block l, on a fixed slice of the validation split (its first ``n_tokens`` targets, in the run's
own non-overlapping windows):

- **the loss increase when the block is skipped**: the validation loss with block l's output replaced by
  its input, minus the loss of the whole model. The block leaves the stack with its norms and scalars (a
  post-norm block's stream then goes on un-renormalized). This is the "performance drop when a layer is
  removed" of LNS (Sun et al. 2025, "The Curse of Depth in Large Language Models", arXiv 2502.05795,
  section 2) and Mix-LN (Li et al. 2024, arXiv 2412.13795), with the validation loss as the performance.
- **the angular distance** between the block's input and output, ``(1/pi) * arccos(cos_sim(x_l, x_{l+1}))``
  per token, averaged over the tokens (Gromov et al. 2024, "The Unreasonable Ineffectiveness of the Deeper
  Layers", arXiv 2403.17887, the definition LNS and Mix-LN use). In [0, 1]: 0 when the block leaves the
  direction of every token's vector unchanged, as an identity block does.

Placements with two streams (ResiDual: the post-norm stream x and the dual stream d): a skipped block
passes both on unchanged (it neither renormalizes x nor adds its sublayers' outputs to d), and the angular
distance is measured on x, the stream the next block's sublayers read.

``GPT`` and ``Block`` do not change for this: ``skipped`` shadows one block's ``forward`` for the length of
a ``with``, and the block inputs and outputs are read by forward hooks removed afterwards. A run's
measurement is cached in its directory (``layer_contribution.json``), so tables are re-rendered without
the checkpoint, as ``eval.json`` is.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from resnorm_lm.data.cache import write_json_atomic
from resnorm_lm.model.block import Stream
from resnorm_lm.model.gpt import GPT
from resnorm_lm.targets import IGNORE_INDEX
from resnorm_lm.train.runs import RunDir

CACHE_FILE = "layer_contribution.json"
DEFAULT_TOKENS = 16_384  # 128 windows of the cpu profile's context 128: 12% of its validation split


@contextmanager
def skipped(block: nn.Module) -> Iterator[None]:
    """Inside the ``with``, ``block`` returns the stream it is given (one tensor, or ResiDual's pair)."""
    block.forward = _pass_through  # an instance attribute shadows the class's forward for this block only
    try:
        yield
    finally:
        del block.forward


def _pass_through(stream: Stream) -> Stream:
    return stream


def angular_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(1/pi) * arccos(cos_sim(a, b))`` along the last dimension: (..., C) x (..., C) -> (...), in [0, 1].

    In fp64: near cos = 1 the arccos magnifies rounding (arccos(1 - e) ~ sqrt(2e)), and fp32 would put an
    identity block at about 1e-4 instead of 0."""
    cos = F.cosine_similarity(a.double(), b.double(), dim=-1)
    return torch.arccos(cos.clamp(-1.0, 1.0)) / math.pi


@dataclass
class LayerContribution:
    """One model's measurement: block 0 (input side) first."""

    tokens: int  # targets counted
    loss: float  # mean cross-entropy of the whole model on the slice (nats/token)
    skipped_loss: list[float]  # the same with block l skipped
    angular_distance: list[float]  # mean over the tokens of the angular distance of block l's input and output

    @property
    def loss_increase(self) -> list[float]:
        return [skipped - self.loss for skipped in self.skipped_loss]


@torch.no_grad()
def measure(model: GPT, x: torch.Tensor, y: torch.Tensor, batch_size: int = 64) -> LayerContribution:
    """Both measurements for every block of ``model`` (in eval mode) on windows ``x`` (N, T) with targets
    ``y`` (N, T); targets equal to IGNORE_INDEX (a last window's padding) are not tokens."""
    distances = torch.zeros(len(model.blocks), dtype=torch.float64, device=x.device)  # (L,): sums over tokens
    valid: list[torch.Tensor] = []  # the current batch's (B, T) mask, read by the hooks
    block_input = model.stream.block_input  # the (B, T, C) tensor a block's sublayers read from the stream

    def recorder(layer: int):
        def hook(module: nn.Module, args: tuple, output: Stream) -> None:
            d = angular_distance(block_input(args[0]), block_input(output))  # (B, T)
            distances[layer] += d[valid[0]].sum()

        return hook

    handles = [block.register_forward_hook(recorder(i)) for i, block in enumerate(model.blocks)]
    try:
        loss, tokens = slice_loss(model, x, y, batch_size, valid)
    finally:
        for handle in handles:
            handle.remove()
    skipped_losses = []
    for block in model.blocks:
        with skipped(block):
            skipped_losses.append(slice_loss(model, x, y, batch_size)[0])
    return LayerContribution(tokens, loss, skipped_losses, (distances / tokens).tolist())


def slice_loss(
    model: GPT, x: torch.Tensor, y: torch.Tensor, batch_size: int, valid: list[torch.Tensor] | None = None
) -> tuple[float, int]:
    """Mean cross-entropy over the targets of ``y`` (N, T) and their number; ``valid`` is set to each
    batch's target mask before its forward pass."""
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, len(x), batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]  # (B, T) each
        if valid is not None:
            valid[:] = [yb != IGNORE_INDEX]
        total += model(xb, yb, reduction="sum")[1].double()  # targets equal to IGNORE_INDEX count for nothing
    tokens = int((y != IGNORE_INDEX).sum())
    return total.item() / max(tokens, 1), tokens


def validation_slice(datamodule, n_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``ceil(n_tokens / T)`` windows of the validation split (all of it when shorter), as the
    evaluation reads them: inputs and targets, (N, T) each."""
    windows = datamodule.eval_windows("validation")
    n = min(len(windows), max(1, math.ceil(n_tokens / datamodule.block_size)))
    pairs = [windows[i] for i in range(n)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def run_contribution(run_dir: Path, n_tokens: int = DEFAULT_TOKENS) -> dict | None:
    """A finished run's measurement at its final weights: from its cache when it was measured at the run's
    last step on the same slice, else from ``checkpoints/last.ckpt`` (cached then); None without either."""
    from resnorm_lm.train.loaded_run import load_run

    run_files = RunDir(run_dir)
    cache = run_files.path / CACHE_FILE
    if cache.is_file():
        cached = json.loads(cache.read_text())
        if cached.get("step") == run_files.summary().get("step") and cached.get("tokens_asked") == n_tokens:
            return cached
    if not run_files.has_checkpoint():
        return None
    run = load_run(run_files.path)  # weights_only: a checkpoint is data; its data checked and set up
    dm = run.datamodule
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = run.model.model.to(device).eval()
    x, y = validation_slice(dm, n_tokens)
    result = measure(model, x.to(device), y.to(device), dm.eval_batch_size)
    record = {
        "step": run.global_step,
        "tokens_asked": n_tokens,
        "device": device,
        **asdict(result),
        "loss_increase": result.loss_increase,
    }
    write_json_atomic(cache, record)
    return record


def block_means(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """The blocks of one (recipe, depth)'s layer_contribution rows, and ``key``'s mean over seeds at each."""
    layers = sorted({r["layer"] for r in rows})
    return layers, [statistics.fmean(r[key] for r in rows if r["layer"] == layer) for layer in layers]

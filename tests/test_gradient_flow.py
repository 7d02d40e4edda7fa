"""Gradient norms per layer at initialization (Xiong et al. 2020, arXiv 2002.04745).

The paper reports, with Xavier init: post-norm gradient norms grow toward the
output layers, pre-norm stays roughly flat. We measure the same on a 12-layer
model with this repository's default (GPT-2) init, and with Xavier's. Where the expectation does not hold
at this scale, the test is an xfail(strict) that names what was measured, so a
change that makes it hold is noticed too.
"""

import pytest
import torch

from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.train.diagnostics import grad_norms_at_init


def measure(placement: str, seed: int = 0, init: str = "gpt2") -> list[float]:
    torch.manual_seed(seed)
    model = GPT(
        GPTConfig(vocab_size=512, block_size=64, n_layer=12, n_head=4, n_embd=128, placement=placement, init=init)
    )
    idx, targets = torch.randint(0, 512, (8, 64)), torch.randint(0, 512, (8, 64))
    return grad_norms_at_init(model, idx, targets)


def describe(norms: list[float]) -> str:
    return " ".join(f"{g:.4f}" for g in norms) + f" (last/first {norms[-1] / norms[0]:.2f})"


def test_prenorm_gradient_norms_are_roughly_flat_across_layers():
    norms = measure("prenorm")
    spread = max(norms) / min(norms)
    assert spread < 2.5, f"pre-norm per-layer grad norms not flat: {describe(norms)}"


@pytest.mark.xfail(
    strict=True,
    reason=(
        "not reproduced at this scale with either init. GPT-2's (std 0.02, depth-scaled projections): post-norm "
        "per-layer grad norms measured flat, about 0.027 in every layer (last/first 0.99-1.02), since sublayer "
        "outputs are small beside the unit-variance stream. Xavier's (as torchscale, which Xiong et al.'s setting "
        "resembles): 10-30x larger, but falling toward the output at 12 blocks (0.80 to 0.39, last/first 0.46)."
    ),
)
@pytest.mark.parametrize("init", ["gpt2", "xavier"])
def test_postnorm_gradient_norms_grow_toward_the_output(init):
    norms = measure("postnorm", init=init)
    increasing = sum(b > a for a, b in zip(norms, norms[1:]))
    assert norms[-1] / norms[0] > 1.5 and increasing >= 8, f"post-norm per-layer grad norms: {describe(norms)}"


def test_postnorm_and_prenorm_differ_in_gradient_scale_at_init():
    """What does hold here: pre-norm's gradients are far larger and fall with depth; post-norm's are not."""
    pre, post = measure("prenorm"), measure("postnorm")
    assert pre[0] > pre[-1], f"pre-norm: {describe(pre)}"
    assert min(pre) > 5 * max(post), f"pre-norm {describe(pre)} vs post-norm {describe(post)}"

"""What the placements' formula tests build blocks from: toy sublayers and norms with non-trivial parameters, at
width ``C``, so that a test sees which sublayer and which norm each term of a formula uses."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from resnorm_lm.model.norms import LayerNorm

C = 16


def make_norm(role=None):
    norm = LayerNorm(C)
    with torch.no_grad():  # non-trivial affine parameters so the test sees which norm is used where
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    return norm


class Toy(nn.Module):
    """A deterministic nonlinear sublayer standing in for attention or the MLP."""

    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(C, C, generator=g) / math.sqrt(C))

    def forward(self, x):
        return torch.tanh(x @ self.w) * 2.0


class Zero(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)


def ln(norm, x):
    """``norm`` (a LayerNorm) applied by its formula, through torch's functional op."""
    return F.layer_norm(x, (C,), norm.weight, norm.bias, norm.eps)

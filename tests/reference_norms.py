"""Plain reference implementations of each norm, written from the formulas (fp64 math)."""

import torch


def layernorm(x, weight, bias, eps):
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased (population) variance
    y = (x - mean) / torch.sqrt(var + eps) * weight.double()
    return y + bias.double() if bias is not None else y


def rmsnorm(x, weight, eps):
    x = x.double()
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * weight.double()


def scalenorm(x, gain, eps):
    x = x.double()
    return gain.double() * x / torch.sqrt((x**2).sum(-1, keepdim=True)).clamp_min(eps)


def dyt(x, alpha, weight, bias):
    y = weight.double() * torch.tanh(alpha.double() * x.double())
    return y + bias.double() if bias is not None else y

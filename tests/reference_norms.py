"""Plain reference implementations of each norm, written from the formulas.

They compute in ``dtype`` (fp64 by default: the exact side of a comparison; fp32 for the noise
floor of a plain fp32 path) and return that dtype.
"""

import torch

F64 = torch.float64


def layernorm(x, weight, bias, eps, dtype=F64):
    x = x.to(dtype)
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased (population) variance
    y = (x - mean) / torch.sqrt(var + eps) * weight.to(dtype)
    return y + bias.to(dtype) if bias is not None else y


def rmsnorm(x, weight, eps, dtype=F64):
    x = x.to(dtype)
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * weight.to(dtype)


def scalenorm(x, gain, eps, dtype=F64):
    x = x.to(dtype)
    return gain.to(dtype) * x / torch.sqrt((x**2).sum(-1, keepdim=True)).clamp_min(eps)


def dyt(x, alpha, weight, bias, dtype=F64):
    y = weight.to(dtype) * torch.tanh(alpha.to(dtype) * x.to(dtype))
    return y + bias.to(dtype) if bias is not None else y

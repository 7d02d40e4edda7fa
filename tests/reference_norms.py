"""Plain reference implementations of each norm, written from the formulas, and the reference of a norm module.

They compute in ``dtype`` (fp64 by default: the exact side of a comparison; fp32 for the noise
floor of a plain fp32 path) and return that dtype.
"""

import torch

from resnorm_lm.model.norms import (
    DynamicErf,
    DynamicTanh,
    LayerNorm,
    NoNorm,
    RMSNorm,
    RMSScaledTanh,
    ScaleNorm,
    build_norm,
)

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


def derf(x, alpha, shift, weight, bias, dtype=F64):
    y = weight.to(dtype) * torch.erf(alpha.to(dtype) * x.to(dtype) + shift.to(dtype))
    return y + bias.to(dtype) if bias is not None else y


def rms_scaled_tanh(x, weight, dtype=F64):
    x = x.to(dtype)
    return weight.to(dtype) * torch.tanh(x / torch.sqrt((x**2).mean()))  # the RMS of the whole input


def reference(norm, x, dtype=F64):
    """The plain-formula output of ``norm`` with the module's own parameters, computed in ``dtype``."""
    if isinstance(norm, LayerNorm):
        return layernorm(x, norm.weight, norm.bias, norm.eps, dtype)
    if isinstance(norm, RMSNorm):
        return rmsnorm(x, norm.weight, norm.eps, dtype)
    if isinstance(norm, ScaleNorm):
        return scalenorm(x, norm.gain, norm.eps, dtype)
    if isinstance(norm, DynamicTanh):
        return dyt(x, norm.alpha, norm.weight, norm.bias, dtype)
    if isinstance(norm, DynamicErf):
        return derf(x, norm.alpha, norm.shift, norm.weight, norm.bias, dtype)
    if isinstance(norm, RMSScaledTanh):
        return rms_scaled_tanh(x, norm.weight, dtype)
    if isinstance(norm, NoNorm):
        return x.to(dtype)
    raise AssertionError(f"no reference for {type(norm).__name__}")


def fp64_twin(norm, name, dim, bias):
    """A fp64 copy of ``norm`` with the same (already rounded) parameter values, for the exact side."""
    twin = build_norm(name, dim, bias=bias).double()
    twin.load_state_dict({k: v.double() for k, v in norm.state_dict().items()})
    return twin

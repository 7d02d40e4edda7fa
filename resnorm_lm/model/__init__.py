"""The model wing: the GPT, its residual placements, its norms and the fused Add & Norm kernels.

    gpt.py           GPTConfig, GPT (nanoGPT-style decoder), count_parameters
    placements.py    where the norm and the residual go: post-norm, pre-norm, sandwich, DeepNorm, ...
    placement_base.py  what every placement offers (Placement) and is given (BlockContext)
    norms.py         LayerNorm, RMSNorm, ScaleNorm, DyT by name; the torch and triton backends
    norms_triton.py  the triton backend's modules over kernels/
    kernels/         the Triton "Add & Norm" kernels and their PyTorch custom operators
    decoding.py      sampling text from a GPT: temperature and top-k

Imports: torch, triton (kernels only), ``resnorm_lm.registry`` and ``resnorm_lm.targets``; nothing from ``data``,
``train`` or ``analysis``. A model is usable without Lightning.
"""

from resnorm_lm.model.gpt import GPT, MLP, Block, CausalSelfAttention, GPTConfig, count_parameters, initial_loss

__all__ = ["GPT", "GPTConfig", "Block", "CausalSelfAttention", "MLP", "count_parameters", "initial_loss"]

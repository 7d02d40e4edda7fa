"""The model wing: the GPT, its residual placements, its norms and the fused Add & Norm kernels.

    gpt.py           GPTConfig, GPT (nanoGPT-style decoder), count_parameters
    placements.py    where the norm and the residual go: post-norm, pre-norm, sandwich, DeepNorm, ... (each a Block)
    block.py         Block, what every placement is, and ResidualStream, the blocks between the stream's two ends
    layers.py        the sublayers: causal self-attention and the MLP
    init.py          the weight inits by name (gpt2, plain, xavier, xavier_rescaled)
    norms.py         LayerNorm, RMSNorm, ScaleNorm, DyT by name; the torch and triton backends
    norms_triton.py  the triton backend's modules over kernels/
    kernels/         the Triton "Add & Norm" kernels and their PyTorch custom operators
    decoding.py      sampling text from a GPT: temperature and top-k

Imports: torch, triton (kernels only), ``resnorm_lm.registry`` and ``resnorm_lm.targets``; nothing from ``data``,
``train`` or ``analysis``. A model is usable without Lightning.
"""

from resnorm_lm.model.block import Block
from resnorm_lm.model.gpt import GPT, GPTConfig, count_parameters, initial_loss
from resnorm_lm.model.layers import MLP, CausalSelfAttention

__all__ = ["GPT", "GPTConfig", "Block", "CausalSelfAttention", "MLP", "count_parameters", "initial_loss"]

"""A GPT-style decoder LM whose normalization and residual placement are chosen by name."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, fields
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from resnorm_lm.model.init import INITS
from resnorm_lm.model.loss import linear_cross_entropy
from resnorm_lm.model.norms import NORM_BACKENDS, NORMS, Norm, build_norm, check_norm_choice
from resnorm_lm.model.placements import PLACEMENTS, BlockContext, Placement, Stream


@dataclass
class GPTConfig:
    """Architecture of the model. Names, not classes, so the config stays serializable."""

    vocab_size: int = 8192  # tokens in the vocabulary (linked from the data when training)
    block_size: int = 256  # context length T, the size of the position table
    n_layer: int = 12  # number of transformer blocks N (2N sublayers)
    n_head: int = 4  # attention heads; must divide n_embd
    n_embd: int = 256  # model width C
    dropout: float = 0.0  # on attention weights, sublayer outputs and embeddings
    # biases in Linear layers and in the norms that have one (layernorm, dyt, dyt_lnout); rmsnorm, scalenorm and
    # dyt_llm never have a bias, whatever this says (False: no bias parameters at all)
    bias: bool = True
    # layernorm | rmsnorm | scalenorm | dyt | dyt_llm | dyt_lnout | none; a placement without norms (rezero) refuses
    # any other than the default or none
    norm: str = "layernorm"
    norm_backend: str = "torch"  # torch | triton
    # inside the square root: (x - mean) / sqrt(var + eps); a norm without one (dyt, dyt_llm, none) refuses another
    # value than the default
    norm_eps: float = 1e-5
    tie_embeddings: bool = True  # the LM head shares the token embedding matrix (False: its own matrix)
    init: str = "gpt2"  # gpt2 | plain | xavier | xavier_rescaled: how the weights start (resnorm_lm/model/init.py)
    placement: str = (
        "prenorm"  # postnorm | prenorm | sandwich | peri_ln | deepnorm | rezero | rezero_shared | mixln | lns | b2t
        # | resi_dual | resi_dual_embed | noresidual
    )

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}); "
                f"for example n_head={_divisor_near(self.n_embd, self.n_head)}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps}")
        placement = PLACEMENTS.get(self.placement)
        INITS.get(self.init)
        norm = NORMS.get(self.norm)
        NORM_BACKENDS.get(self.norm_backend)
        self._refuse_settings_nothing_reads(placement, norm)
        check_norm_choice(self.norm, self.norm_backend)
        if norm.needs_roles and not placement.names_norm_roles:
            roled = [name for name in PLACEMENTS.names() if PLACEMENTS.get(name).names_norm_roles]
            raise ValueError(
                f"norm {self.norm!r} is initialized by what each norm feeds, which placement {self.placement!r} "
                f"does not say; use it with placement: {' or '.join(roled)}"
            )

    def _refuse_settings_nothing_reads(self, placement: type[Placement], norm: type[Norm]) -> None:
        """A setting changed from its default that the chosen placement or norm never reads is a mistake in the
        config, not a choice: say so rather than train a model that ignores it. (Defaults are accepted: recipes
        state them for every variant.)"""
        default = {f.name: f.default for f in fields(GPTConfig)}
        if not placement.has_norms:
            keys = [key for key in ("norm", "norm_backend", "norm_eps")
                    if getattr(self, key) != default[key] and not (key == "norm" and self.norm == "none")]  # fmt: skip
            if keys:
                given = ", ".join(f"{k}={getattr(self, k)!r}" for k in keys)
                raise ValueError(
                    f"placement {self.placement!r} has no norm, so {given} would change nothing: leave "
                    f"{' and '.join(keys)} at the default ({', '.join(f'{k}={default[k]!r}' for k in keys)}; norm "
                    "may also be 'none'), or choose a placement with norms"
                )
        if not norm.has_eps and self.norm_eps != default["norm_eps"]:
            raise ValueError(
                f"norm {self.norm!r} has no epsilon, so norm_eps={self.norm_eps!r} would change nothing: leave "
                f"norm_eps at the default ({default['norm_eps']!r}), or choose a norm with one (layernorm, rmsnorm)"
            )


def norm_factory(cfg: GPTConfig):
    """A no-argument builder of the configured norm (kind, backend, width, eps, bias)."""
    return partial(build_norm, cfg.norm, cfg.n_embd, backend=cfg.norm_backend, eps=cfg.norm_eps, bias=cfg.bias)


def _divisor_near(n: int, k: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - k))


# The SDPA backend for CPU inputs of each dtype; a dtype not here gets SDPA's own choice. Set once per process by
# whoever measured which is fastest on this CPU (resnorm_lm/train/cpu_attention.py): torch's CPU flash kernel
# is the faster in fp32 but several times slower than the math backend in bf16 (docs/benchmarks.md).
CPU_SDPA_BACKENDS: dict[torch.dtype, SDPBackend] = {}


def use_cpu_sdpa_backend(dtype: torch.dtype, backend: SDPBackend | None) -> None:
    """Run attention on CPU tensors of ``dtype`` with ``backend`` where it can run, else the math backend (None:
    SDPA's own choice), in this process."""
    if backend is None:
        CPU_SDPA_BACKENDS.pop(dtype, None)
    else:
        CPU_SDPA_BACKENDS[dtype] = backend


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention`` (on CPU with the backend
    chosen for the dtype in ``CPU_SDPA_BACKENDS``)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.n_embd = cfg.n_embd
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v fused
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def value_weight(self) -> torch.Tensor:
        """The (C, C) rows of the fused weight that produce v (a view)."""
        return self.c_attn.weight[2 * self.n_embd :]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        dropout = self.dropout if self.training else 0.0
        # eager only: a compiled graph keeps Inductor's own choice (and no guard on this process-wide table)
        eager_cpu = q.device.type == "cpu" and not torch.compiler.is_compiling()
        backend = CPU_SDPA_BACKENDS.get(q.dtype) if eager_cpu else None
        # the chosen backend first, math where it cannot run (CPU flash has no dropout)
        preferred = sdpa_kernel([backend, SDPBackend.MATH], set_priority=True) if backend is not None else None
        with preferred or contextlib.nullcontext():
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward: C -> 4C -> GELU -> C."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))  # (B, T, 4C) inside


class Block(nn.Module):
    """Attention and MLP sublayers wired by ``placement``, this block's instance of the model's placement."""

    def __init__(self, cfg: GPTConfig, placement: Placement) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(cfg)
        self.mlp = MLP(cfg)
        self.placement = placement  # its norms and learnable scalars; its formula in its docstring

    def forward(self, stream: Stream) -> Stream:
        return self.placement(stream, (self.attn, self.mlp))


class GPT(nn.Module):
    """Token + learned position embeddings, N blocks, a readout, and an LM head (tied to the token
    embedding unless ``tie_embeddings`` is False).

    ``placement`` (the class registered under ``config.placement``) owns the residual wiring: each block's is an
    instance of it (``Block.placement``, holding that block's norms), and it says how the stream starts
    (``embed``, after ``embedding_norm``), how it is read out (``readout``) and which tensor is the residual.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.placement = PLACEMENTS.get(cfg.placement)
        make_norm = norm_factory(cfg)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.embed_scale = NORM_BACKENDS.get(cfg.norm_backend).norm_class(cfg.norm).input_scale(cfg.n_embd)
        self.blocks = nn.ModuleList(
            [Block(cfg, self.placement(BlockContext(layer, cfg.n_layer, make_norm))) for layer in range(cfg.n_layer)]
        )
        self.embedding_norm = self.placement.build_embedding_norm(make_norm)  # Identity but for Peri-LN's
        self.readout = self.placement.build_readout(make_norm)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # tied input/output embeddings
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The configured init (``init``; GPT-2's by default), then each placement's rule for its sublayers."""
        init = INITS.get(self.config.init)()
        init.init_weights(self)
        for block in self.blocks:
            block.placement.init_sublayers(block.attn, block.mlp, init)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, reduction: str = "mean"
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """idx, targets: (B, T) token ids. Without targets: logits (B, T, V) and None. With targets: None and the
        cross-entropy (``reduction`` mean or sum over targets other than ``IGNORE_INDEX``), computed chunk by chunk
        without the logits (resnorm_lm/model/loss.py)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.drop(self.embedding_norm(self.embed_scale(self.wte(idx) + self.wpe(pos))))  # (B, T, C)
        stream = self.placement.embed(x)
        for block in self.blocks:
            stream = block(stream)
        h = self.readout(stream)  # (B, T, C)
        if targets is None:
            return self.lm_head(h), None  # (B, T, V)
        return None, linear_cross_entropy(h.flatten(0, 1), self.lm_head.weight, targets.flatten(), reduction)

    def flops_per_token(self, context: int | None = None) -> int:
        """Training FLOPs per token at ``context`` (default block_size): 6N + 12 L C T (PaLM: Chowdhery et al. 2022,
        arXiv 2204.02311, appendix B). The project's one FLOPs formula: the Trainer and the benchmarks use it."""
        cfg = self.config
        return 6 * self.num_parameters() + 12 * cfg.n_layer * cfg.n_embd * (context or cfg.block_size)

    def num_parameters(self, non_embedding: bool = True) -> int:
        """Parameters counted once (the tied head is not counted twice); without position embeddings by default."""
        n = count_parameters(self)
        return n - self.wpe.weight.numel() if non_embedding else n


def count_parameters(model: nn.Module) -> int:
    """All distinct parameters of a module (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters())


def initial_loss(vocab_size: int) -> float:
    """The cross-entropy of a uniform prediction, ln(V): what an untrained model should score."""
    return math.log(vocab_size)

"""A GPT-style decoder LM whose normalization and residual placement are chosen by name."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from functools import partial

import torch
from torch import nn

from resnorm_lm.model.block import Block
from resnorm_lm.model.init import INITS
from resnorm_lm.model.layers import QK_NORMS
from resnorm_lm.model.loss import linear_cross_entropy
from resnorm_lm.model.norms import NORM_BACKENDS, NORMS, Norm, build_norm, check_norm_choice
from resnorm_lm.model.placements import PLACEMENTS


@dataclass
class GPTConfig:
    """Architecture of the model. Names, not classes, so the config stays serializable."""

    vocab_size: int = 8192  # tokens in the vocabulary (linked from the data when training)
    block_size: int = 256  # context length T, the size of the position table
    n_layer: int = 12  # number of transformer blocks N (2N sublayers)
    n_head: int = 4  # attention heads; must divide n_embd
    n_embd: int = 256  # model width C
    dropout: float = 0.0  # on attention weights, sublayer outputs and embeddings
    # biases in Linear layers and in the norms that have one (layernorm, dyt, dyt_lnout, derf); rmsnorm, scalenorm,
    # dyt_llm and dyt_paper never have a bias, whatever this says (False: no bias parameters at all)
    bias: bool = True
    # layernorm | rmsnorm | scalenorm | derf | none, and DyT's setups (dyt | dyt_llm | dyt_paper and its diagnostic
    # arms); a placement without norms (rezero) refuses any other than the default or none
    norm: str = "layernorm"
    norm_backend: str = "torch"  # torch | triton
    # inside the square root: (x - mean) / sqrt(var + eps); a norm without one (dyt, dyt_llm, none) refuses another
    # value than the default
    norm_eps: float = 1e-5
    tie_embeddings: bool = True  # the LM head shares the token embedding matrix (False: its own matrix)
    # none | full | per_head: RMSNorm on the attention's queries and keys (OLMo 2's over all heads; Qwen3's per head)
    qk_norm: str = "none"
    init: str = "gpt2"  # gpt2 | plain | xavier | xavier_rescaled: how the weights start (resnorm_lm/model/init.py)
    placement: str = (
        "prenorm"  # postnorm | prenorm | sandwich | peri_ln | deepnorm | rezero | rezero_shared | mixln | lns | b2t
        # | resi_dual | resi_dual_embed | noresidual | olmo2 | olmo2_embed_norm | hc | mhc | attnres | attnres_block
        # | denseformer
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
        QK_NORMS.get(self.qk_norm)
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

    def _refuse_settings_nothing_reads(self, placement: type[Block], norm: type[Norm]) -> None:
        """A setting changed from its default that the chosen placement or norm never reads is a mistake in the
        config, not a choice: say so rather than train a model that ignores it. (Defaults are accepted: recipes
        state them for every variant.)"""
        default = {f.name: f.default for f in fields(GPTConfig)}
        if not placement.has_norms:
            keys = [
                key
                for key in ("norm", "norm_backend", "norm_eps")
                if getattr(self, key) != default[key] and not (key == "norm" and self.norm == "none")
            ]
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


class GPT(nn.Module):
    """Token + learned position embeddings, the residual stream through N blocks, and an LM head (tied to the
    token embedding unless ``tie_embeddings`` is False)::

        idx ──> wte + wpe ──> stream.enter ──> block 0 ... block N-1 ──> stream.exit ──> lm_head ──> logits

    The placement named ``config.placement`` is the blocks' class (placements.py): it writes each block's formula
    and builds the stream (``Block.residual_stream``: how it enters from the embeddings and how it is read out).
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.stream = PLACEMENTS.get(cfg.placement).residual_stream(cfg, norm_factory(cfg))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # tied input/output embeddings
        self.register_load_state_dict_pre_hook(rename_keys_of_older_checkpoints)
        self.reset_parameters()

    @property
    def blocks(self) -> nn.ModuleList:
        return self.stream.blocks

    def reset_parameters(self) -> None:
        """The configured init (``init``; GPT-2's by default) on every weight, then each block's rule for depth."""
        init = INITS.get(self.config.init)()
        init.init_weights(self)
        for block in self.blocks:
            block.init_depth(init)

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
        h = self.stream(self.wte(idx) + self.wpe(pos))  # (B, T, C): in through the blocks and out
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


# A checkpoint written before each placement became a block names its weights as the model was then built:
# the blocks at the top level with their norms under ``placement``, the stream's ends as three modules.
OLDER_KEYS = [
    (re.compile(old), new)
    for old, new in (
        (r"^blocks\.(\d+)\.placement\.(?:inner\.)?norms\.0\.", r"stream.blocks.\1.attn_norm."),
        (r"^blocks\.(\d+)\.placement\.(?:inner\.)?norms\.1\.", r"stream.blocks.\1.mlp_norm."),
        (r"^blocks\.(\d+)\.placement\.norms_in\.0\.", r"stream.blocks.\1.attn_in_norm."),
        (r"^blocks\.(\d+)\.placement\.norms_in\.1\.", r"stream.blocks.\1.mlp_in_norm."),
        (r"^blocks\.(\d+)\.placement\.norms_out\.0\.", r"stream.blocks.\1.attn_out_norm."),
        (r"^blocks\.(\d+)\.placement\.norms_out\.1\.", r"stream.blocks.\1.mlp_out_norm."),
        (r"^blocks\.(\d+)\.placement\.gates$", r"stream.blocks.\1.alpha"),
        (r"^blocks\.", "stream.blocks."),
        (r"^embed_scale\.", "stream.embed_scale."),
        (r"^embedding_norm\.", "stream.embed_norm."),
        (r"^readout\.(?:norm\.)?", "stream.final_norm."),
    )
]


def rename_keys_of_older_checkpoints(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """A state-dict pre-hook: the weights of a checkpoint from before placements were blocks (``OLDER_KEYS``),
    renamed to today's names in place, so that such a checkpoint loads and gives the same logits."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        name = key[len(prefix) :]
        for pattern, new in OLDER_KEYS:
            if pattern.match(name):
                state_dict[prefix + pattern.sub(new, name, count=1)] = state_dict.pop(key)
                break


def count_parameters(model: nn.Module) -> int:
    """All distinct parameters of a module (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters())


def initial_loss(vocab_size: int) -> float:
    """The cross-entropy of a uniform prediction, ln(V): what an untrained model should score."""
    return math.log(vocab_size)

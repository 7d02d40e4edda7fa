"""resnorm-lm: what normalization and residual placement really do in a GPT-style LM."""

from resnorm_lm.model import GPT, GPTConfig
from resnorm_lm.norms import NORM_BACKENDS, NORMS, build_norm
from resnorm_lm.placements import PLACEMENTS

__all__ = ["GPT", "GPTConfig", "NORMS", "NORM_BACKENDS", "PLACEMENTS", "build_norm"]
__version__ = "0.1.0"

"""resnorm-lm: what normalization and residual placement really do in a GPT-style LM.

The package has three wings, and dependencies run one way, cli -> analysis -> train -> data, model:

    model/     the GPT, placements, norms and the fused kernels (imports nothing of the others)
    data/      corpora -> tokenizer -> token bins -> sampling (imports nothing of the others)
    train/     the LightningModule, the Trainer and everything a run needs (model, data)
    analysis/  eval, compare and sweeps, plots, layer contribution, generation (train, model, data)
    cli.py     the ``resnorm-lm`` command; registry.py, the by-name registry model and data share; targets.py,
               the target value both wings skip (IGNORE_INDEX)
"""

from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.norms import NORM_BACKENDS, NORMS, build_norm
from resnorm_lm.model.placements import PLACEMENTS

__all__ = ["GPT", "GPTConfig", "NORMS", "NORM_BACKENDS", "PLACEMENTS", "build_norm"]
__version__ = "0.1.0"

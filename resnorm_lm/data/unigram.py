"""The unigram reference: what a model that ignores context scores.

A language model whose validation loss stays at this level has learned token
frequencies and nothing else: ``compare`` flags such runs "not learning",
apart from runs that diverged.
"""

from __future__ import annotations

import numpy as np

from resnorm_lm.data.prepare import PreparedData


def unigram_cross_entropy(prepared: PreparedData, split: str = "validation") -> float:
    """Cross-entropy (nats per token) on ``split``'s targets of predicting every token by its frequency
    in the train split, add-one smoothed so a token unseen in training costs ln(N + V), not infinity."""
    vocab = prepared.manifest.vocab_size
    counts = np.bincount(prepared.tokens("train"), minlength=vocab).astype(np.float64) + 1.0  # (V,)
    log_prob = np.log(counts) - np.log(counts.sum())  # (V,)
    targets = np.asarray(prepared.tokens(split)[1:], dtype=np.int64)  # every token but the first is a target
    return float(-log_prob[targets].mean())

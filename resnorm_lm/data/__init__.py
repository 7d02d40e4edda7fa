"""Data pipeline: corpora -> byte-level BPE -> token bins -> resumable, sharded sampling.

``TextDataModule`` (Lightning) is imported lazily so that ``python -m
resnorm_lm.data`` does not pay for importing Lightning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resnorm_lm.data.bins import Manifest, SplitStats
from resnorm_lm.data.cache import DataCache, atomic_write, default_cache_dir
from resnorm_lm.data.corpora import CORPORA, Corpus, build_corpus
from resnorm_lm.data.errors import CorpusUnavailableError, DataError
from resnorm_lm.data.prepare import PreparedData, prepare
from resnorm_lm.data.sampling import (
    EvalShardSampler,
    EvalWindows,
    ResumableBatchSampler,
    TrainBatchStream,
    TrainWindows,
)
from resnorm_lm.data.tokenizer import EOT, TokenizerSettings, train_tokenizer

if TYPE_CHECKING:
    from resnorm_lm.data.datamodule import TextDataModule

__all__ = [
    "CORPORA",
    "EOT",
    "Corpus",
    "CorpusUnavailableError",
    "DataCache",
    "DataError",
    "EvalShardSampler",
    "EvalWindows",
    "Manifest",
    "PreparedData",
    "ResumableBatchSampler",
    "SplitStats",
    "TextDataModule",
    "TokenizerSettings",
    "TrainBatchStream",
    "TrainWindows",
    "atomic_write",
    "build_corpus",
    "default_cache_dir",
    "prepare",
    "train_tokenizer",
]


def __getattr__(name: str):
    if name == "TextDataModule":
        from resnorm_lm.data.datamodule import TextDataModule

        return TextDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

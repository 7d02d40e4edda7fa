"""Byte-level BPE trained on the train split, cached by (corpus fingerprint, settings).

Every byte is in the base alphabet, so any text encodes; ``<|endoftext|>`` is a
special token that follows every document in the token stream. Training is
deterministic: the same documents and settings give the same ``tokenizer.json``.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from resnorm_lm.data.cache import DataCache, atomic_write, sha256_json
from resnorm_lm.data.errors import DataError

EOT = "<|endoftext|>"
MIN_VOCAB = 257  # 256 bytes + <|endoftext|>


@dataclass(frozen=True)
class TokenizerSettings:
    vocab_size: int = 8192  # upper bound; the trained vocabulary may be smaller on tiny corpora
    min_frequency: int = 2  # a merge needs a pair seen this often
    kind: str = "byte-bpe"
    version: int = 1  # bump when training changes

    def __post_init__(self) -> None:
        if self.vocab_size < MIN_VOCAB:
            raise DataError(f"vocab_size must be >= {MIN_VOCAB} (256 bytes + {EOT}), got {self.vocab_size}")

    def key(self, corpus_fingerprint: str) -> str:
        return sha256_json({"corpus": corpus_fingerprint, **asdict(self)})[:20]


def train_tokenizer(documents: list[str], settings: TokenizerSettings, progress: bool = True) -> Tokenizer:
    """Train byte-level BPE on ``documents``; the result has at most ``settings.vocab_size`` tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=settings.vocab_size,
        min_frequency=settings.min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress and sys.stderr.isatty(),
    )
    tokenizer.train_from_iterator(documents, trainer=trainer, length=len(documents))
    if tokenizer.get_vocab_size() > settings.vocab_size:  # cannot happen with the settings above
        raise DataError(f"trained {tokenizer.get_vocab_size()} tokens, more than vocab_size={settings.vocab_size}")
    return tokenizer


def tokenizer_path(cache: DataCache, corpus_fingerprint: str, settings: TokenizerSettings) -> Path:
    return cache.root / "tokenizers" / settings.key(corpus_fingerprint) / "tokenizer.json"


def load_or_train(
    cache: DataCache, corpus_fingerprint: str, train_documents: list[str], settings: TokenizerSettings
) -> tuple[Tokenizer, Path]:
    """The cached tokenizer for this corpus and settings, trained and saved atomically if missing."""
    path = tokenizer_path(cache, corpus_fingerprint, settings)
    if path.exists():
        try:
            return Tokenizer.from_file(str(path)), path
        except Exception as e:  # unreadable file: train again
            print(f"resnorm-lm data: {path} is unreadable ({e}); training again", file=sys.stderr)
    print(f"resnorm-lm data: training byte-level BPE (vocab_size <= {settings.vocab_size})", file=sys.stderr)
    tokenizer = train_tokenizer(train_documents, settings)
    with atomic_write(path, "w") as f:
        f.write(tokenizer.to_str())
    return tokenizer, path

"""``prepare(corpus)``: corpus -> tokenizer -> token bins + manifest, cached and verified.

The prepared folder is keyed by the corpus *source* (archive hash, file stats,
Hub path and settings) and the tokenizer settings, so a warm call finds it
without reading the corpus; its manifest records the content fingerprint.

Concurrent preparations of the same corpus (parallel jobs, several nodes on one
shared cache) are safe: each builds in a private folder and renames it into
place; a process that loses the race uses the winner's folder (see ``cache``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from resnorm_lm.data.bins import FORMAT_VERSION, Manifest, check_prepared, choose_dtype, tokenizer_file, write_split
from resnorm_lm.data.cache import (
    DataCache,
    build_lock,
    private_folder,
    publish_folder,
    sha256_file,
    sha256_json,
    write_json_atomic,
)
from resnorm_lm.data.corpora import SPLITS, Corpus, build_corpus
from resnorm_lm.data.errors import CorpusChangedError
from resnorm_lm.data.tokenizer import EOT, TokenizerSettings, load_or_train


@dataclass
class PreparedData:
    """A verified preparation: token bins per split, their manifest, the tokenizer."""

    folder: Path
    manifest: Manifest
    tokenizer_path: Path

    @property
    def paths(self) -> dict[str, Path]:
        return {s: self.folder / st.file for s, st in self.manifest.splits.items()}

    def tokens(self, split: str) -> np.ndarray:
        """The split's token ids, memory-mapped read-only: (n_tokens,) uint16 or uint32."""
        return np.memmap(self.paths[split], dtype=np.dtype(self.manifest.dtype), mode="r")

    @cached_property
    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.tokenizer_path))


def _log(message: str) -> None:
    print(f"resnorm-lm data: {message}", file=sys.stderr)


def prepare(
    corpus: str = "shakespeare",
    *,
    files: list[str] | dict[str, list[str]] | None = None,
    vocab_size: int = 8192,
    cache_dir: str | os.PathLike | None = None,
    dtype: str = "auto",
    max_chars: int | None = None,
    path: str | None = None,
    min_frequency: int = 2,
    expected_fingerprint: str | None = None,
) -> PreparedData:
    """Prepare (or find in the cache) the token bins of ``corpus`` and return them.

    ``files`` is for ``corpus="text"``, ``max_chars`` for streamed corpora,
    ``path`` replaces a Hub corpus's dataset path (a local mirror).
    ``expected_fingerprint`` (a checkpoint's data): when the corpus must be read again and its documents
    have another fingerprint, raise ``CorpusChangedError`` before a tokenizer is trained or anything is written.
    """
    cache = DataCache(cache_dir)
    source = build_corpus(corpus, cache, files=files, max_chars=max_chars, path=path)
    settings = TokenizerSettings(vocab_size=vocab_size, min_frequency=min_frequency)
    np_dtype = choose_dtype(vocab_size, dtype)
    key = sha256_json(
        {"format": FORMAT_VERSION, "corpus": corpus, "source": source.source_key(), **asdict(settings), "dtype": dtype}
    )
    folder = cache.root / "prepared" / f"{corpus}-{key[:16]}"
    tokenizers_root = cache.root / "tokenizers"

    manifest, reason = check_prepared(folder, key, tokenizers_root)
    if manifest is not None:
        return PreparedData(folder, manifest, tokenizer_file(tokenizers_root, manifest))
    documents = source.documents()  # read once, and checked before anything is written (a lock file included)
    if expected_fingerprint is not None and documents.fingerprint != expected_fingerprint:
        raise CorpusChangedError(corpus, expected_fingerprint, documents.fingerprint)
    with build_lock(folder):
        manifest, reason = check_prepared(folder, key, tokenizers_root)  # another process built it while we waited
        if manifest is not None:
            return PreparedData(folder, manifest, tokenizer_file(tokenizers_root, manifest))
        if folder.exists():
            _log(f"cache at {folder} is invalid ({reason}); rebuilding")
        with private_folder(folder) as build:
            manifest = _build(build, corpus, key, source, documents, settings, np_dtype, cache)
            if not publish_folder(build, folder, lambda f: check_prepared(f, key, tokenizers_root)[0] is not None):
                manifest, _ = check_prepared(folder, key, tokenizers_root)  # another process's, the same tokens
    return PreparedData(folder, manifest, tokenizer_file(tokenizers_root, manifest))


def _build(
    folder: Path,
    corpus: str,
    key: str,
    source: Corpus,
    documents,
    settings: TokenizerSettings,
    np_dtype: np.dtype,
    cache: DataCache,
) -> Manifest:
    """Tokenizer (cached), token bins and, last, the manifest of ``source``'s ``documents``, written into
    ``folder``."""
    tokenizer, tok_path = load_or_train(cache, documents.fingerprint, documents.splits["train"], settings)
    eot_id = tokenizer.token_to_id(EOT)
    splits = {
        s: write_split(tokenizer, documents.splits[s], folder / f"{s}.bin", np_dtype, eot_id, f"tokenize {s}")
        for s in SPLITS
    }
    manifest = Manifest(
        corpus=corpus,
        corpus_fingerprint=documents.fingerprint,
        source_key=key,
        tokenizer_sha256=sha256_file(tok_path),
        tokenizer_key=tok_path.parent.name,
        tokenizer_settings=asdict(settings),
        vocab_size=tokenizer.get_vocab_size(),
        eot_id=eot_id,
        dtype=np_dtype.name,
        splits=splits,
        notes=documents.notes,
        corpus_revision=source.revision(),
    )
    write_json_atomic(folder / "manifest.json", manifest.to_dict())
    return manifest


def summary(prepared: PreparedData) -> dict[str, Any]:
    """The manifest plus where things are, for printing."""
    return {**prepared.manifest.to_dict(), "folder": str(prepared.folder), "tokenizer": str(prepared.tokenizer_path)}

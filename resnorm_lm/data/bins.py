"""Token bins: one flat array file per split plus ``manifest.json``.

A split's bin is its documents' token ids, each document followed by
``<|endoftext|>``, as raw uint16 (vocab <= 65536) or uint32, read with
``np.memmap``. The bins are written first (temp file, then rename), the
manifest last, so a preparation that is interrupted never looks valid.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from resnorm_lm.data.cache import atomic_write, sha256_file
from resnorm_lm.data.errors import DataError

FORMAT_VERSION = 1
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def choose_dtype(vocab_size: int, dtype: str = "auto") -> np.dtype:
    """uint16 when every id fits, else uint32; an explicit ``dtype`` too small is an error."""
    if dtype not in ("auto", *DTYPES):
        raise DataError(f"unknown token dtype {dtype!r}; valid dtypes: auto, {', '.join(DTYPES)}")
    if vocab_size > 2**32:
        raise DataError(
            f"vocab_size={vocab_size:,} does not fit uint32 token ids (max {2**32:,}); choose a smaller one"
        )
    if dtype == "auto":
        dtype = "uint16" if vocab_size <= 2**16 else "uint32"
    limit = np.iinfo(DTYPES[dtype]).max + 1
    if vocab_size > limit:
        raise DataError(f"vocab_size={vocab_size:,} does not fit {dtype} token ids (max {limit:,}); use dtype=auto")
    return np.dtype(DTYPES[dtype])


@dataclass
class SplitStats:
    file: str  # bin file name inside the prepared folder
    tokens: int  # token ids in the bin, <|endoftext|> included
    documents: int
    bytes: int  # UTF-8 bytes of the documents' text (separators excluded)
    words: int  # whitespace-separated words


@dataclass
class Manifest:
    corpus: str
    corpus_fingerprint: str
    source_key: str  # hash of the corpus source and settings (the cache folder's key)
    tokenizer_sha256: str  # of tokenizer.json
    tokenizer_key: str  # folder of tokenizer.json under tokenizers/
    tokenizer_settings: dict[str, Any]
    vocab_size: int  # tokens the tokenizer has (<= the requested size)
    eot_id: int
    dtype: str
    splits: dict[str, SplitStats]
    notes: str = ""
    corpus_revision: str | None = None  # the pinned upstream revision (Hub corpora); None: pinned by content
    format_version: int = FORMAT_VERSION
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        data = dict(data)
        data["splits"] = {s: SplitStats(**v) for s, v in data["splits"].items()}
        return cls(**data)


def write_split(
    tokenizer: Tokenizer, documents: list[str], path: Path, dtype: np.dtype, eot_id: int, desc: str, chunk: int = 256
) -> SplitStats:
    """Encode ``documents`` in batches and write their ids (each document then EOT) to ``path`` atomically."""
    from tqdm.auto import tqdm

    tokens = 0
    limit = np.iinfo(dtype).max
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # fast: no offsets (tokenizers>=0.21)
    with atomic_write(path, "wb") as f, tqdm(total=len(documents), desc=desc, unit="doc") as bar:
        for start in range(0, len(documents), chunk):
            batch = documents[start : start + chunk]
            encoded = encode(batch, add_special_tokens=False)
            ids = np.concatenate([np.append(np.asarray(e.ids, dtype=np.int64), eot_id) for e in encoded])  # (n,)
            if ids.max() > limit:
                raise DataError(f"token id {ids.max()} does not fit {dtype}")
            ids.astype(dtype).tofile(f)
            tokens += ids.size
            bar.update(len(batch))
    return SplitStats(
        file=path.name,
        tokens=tokens,
        documents=len(documents),
        bytes=sum(len(d.encode("utf-8")) for d in documents),
        words=sum(len(d.split()) for d in documents),
    )


def tokenizer_file(tokenizers_root: Path, manifest: Manifest) -> Path:
    return tokenizers_root / manifest.tokenizer_key / "tokenizer.json"


def check_prepared(folder: Path, source_key: str, tokenizers_root: Path) -> tuple[Manifest | None, str]:
    """``(manifest, "")`` when the folder holds a complete preparation, else ``(None, reason)``."""
    path = folder / "manifest.json"
    if not path.exists():
        return None, "no manifest.json"
    try:
        manifest = Manifest.from_dict(json.loads(path.read_text()))
    except Exception as e:
        return None, f"manifest.json is unreadable ({type(e).__name__}: {e})"
    if manifest.format_version != FORMAT_VERSION:
        return None, f"format version {manifest.format_version}, expected {FORMAT_VERSION}"
    if manifest.source_key != source_key:
        return None, "manifest is for another corpus source"
    itemsize = np.dtype(manifest.dtype).itemsize
    for stats in manifest.splits.values():
        bin_path = folder / stats.file
        if not bin_path.exists():
            return None, f"{stats.file} is missing"
        if bin_path.stat().st_size != stats.tokens * itemsize:
            return None, f"{stats.file} has {bin_path.stat().st_size} bytes, expected {stats.tokens * itemsize}"
    tokenizer_json = tokenizer_file(tokenizers_root, manifest)
    if not tokenizer_json.exists():
        return None, f"{tokenizer_json} is missing"
    if sha256_file(tokenizer_json) != manifest.tokenizer_sha256:
        return None, "tokenizer.json does not match the manifest's hash"
    return manifest, ""

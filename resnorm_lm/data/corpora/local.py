"""Local text files through the ``datasets`` text builder; each file is one document.

``files`` is a list of paths or globs (all train) or a dict ``split -> paths``.
A split left out (validation, test) is carved from the end of train: the last
5% of its documents (at least one) each, in file order. With fewer than 3
files, paragraphs (blank-line separated) become the documents instead.
"""

from __future__ import annotations

import codecs
import glob
import os
import re
from typing import Any

from resnorm_lm.data.cache import DataCache
from resnorm_lm.data.corpora.base import SPLITS, Corpus, carve_tail, normalize_document, register_corpus
from resnorm_lm.data.errors import DataError

CARVE_FRACTION = 0.05


def resolve_files(patterns: list[str]) -> list[str]:
    """Absolute paths for paths or globs, in the order given (globs sorted); a miss names the pattern."""
    paths: list[str] = []
    for pattern in patterns:
        expanded = os.path.expanduser(str(pattern))
        matches = sorted(glob.glob(expanded)) if glob.has_magic(expanded) else [expanded]
        if not glob.has_magic(expanded) and os.path.isdir(expanded):
            raise DataError(f"data.files: {pattern!r} is a folder; give its files, e.g. '{pattern.rstrip('/')}/*.txt'")
        matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise DataError(f"data.files: no file matches {pattern!r} (looked from {os.getcwd()})")
        paths += [os.path.abspath(m) for m in matches]
    return paths


def check_utf8(path: str, chunk: int = 1 << 20) -> None:
    """A readable UTF-8 text file, or a DataError that names the file and the first bad byte."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    try:
        with open(path, "rb") as f:
            while block := f.read(chunk):
                try:
                    decoder.decode(block)
                except UnicodeDecodeError as err:
                    bad = offset + err.start
                    raise DataError(
                        f"data.files: {path} is not UTF-8 text (byte 0x{block[err.start]:02x} at offset {bad}); "
                        f"convert it first, e.g. iconv -f latin1 -t utf-8 {path} > converted.txt"
                    ) from None
                offset += len(block)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(f"data.files: {path} ends inside a UTF-8 character (truncated?)") from None
    except OSError as err:
        raise DataError(f"data.files: cannot read {path}: {err.strerror}") from None


@register_corpus("text")
class TextCorpus(Corpus):
    """Your own UTF-8 text files: ``data.corpus=text data.files=[a.txt, 'dir/*.txt']``."""

    options = ("files",)

    def __init__(self, cache: DataCache, files: list[str] | dict[str, list[str]] | str | None = None) -> None:
        super().__init__(cache)
        if not files:
            raise DataError("data.corpus=text needs data.files: a list of paths or globs, or {split: paths}")
        if isinstance(files, (str, os.PathLike)):
            files = [str(files)]
        if not isinstance(files, dict):
            files = {"train": list(files)}
        unknown = sorted(set(files) - set(SPLITS))
        if unknown or "train" not in files:
            raise DataError(f"data.files splits must include 'train' and be among {list(SPLITS)}, got {sorted(files)}")
        self.files = {s: resolve_files([files[s]] if isinstance(files[s], str) else list(files[s])) for s in files}

    def source_key(self) -> dict[str, Any]:
        stats = {s: [(p, os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in ps] for s, ps in self.files.items()}
        return {"files": stats, **self.settings()}

    def settings(self) -> dict[str, Any]:
        return {"carved": [s for s in SPLITS if s not in self.files], "carve_fraction": CARVE_FRACTION}

    @property
    def notes(self) -> str:  # type: ignore[override]
        carved = self.settings()["carved"]
        return f"{' and '.join(carved)} carved from the end of train" if carved else ""

    def load_dataset(self):  # on a cache miss only
        import datasets

        for path in sorted({p for ps in self.files.values() for p in ps}):
            check_utf8(path)  # before datasets' text builder, whose error would name neither file nor byte

        loaded = datasets.load_dataset(
            "text", data_files=self.files, sample_by="document", cache_dir=str(self.cache.hf_datasets)
        )
        splits = {s: list(loaded[s]["text"]) for s in loaded}
        carved = [s for s in SPLITS if s not in splits]
        if carved:
            train = [d for d in splits["train"] if normalize_document(d)]
            if len(train) < 3:
                train = [p for d in train for p in re.split(r"\n\s*\n", d) if normalize_document(p)]
            count = max(1, round(CARVE_FRACTION * len(train)))
            if len(train) < 1 + count * len(carved):
                raise DataError(
                    f"data.files: cannot carve {' and '.join(carved)} from {len(train)} document(s)/paragraph(s) "
                    "of train; give more text or files for every split ({train: ..., validation: ..., test: ...})"
                )
            for split in reversed(carved):  # test takes the very end, validation the part before it
                train, splits[split] = carve_tail(train, count)
            splits["train"] = train
        return datasets.DatasetDict({s: datasets.Dataset.from_dict({"text": splits[s]}) for s in SPLITS})

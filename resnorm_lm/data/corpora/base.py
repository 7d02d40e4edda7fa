"""The corpus interface: splits of documents through ``datasets``, normalized and fingerprinted.

A corpus yields ``train``/``validation``/``test`` as a ``datasets.DatasetDict``
with a ``text`` column, one row per document; :meth:`Corpus.documents` turns
that into normalized strings and a content fingerprint. Every corpus takes the
same path from there (tokenizer, token bins).
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from resnorm_lm.data.cache import DataCache
from resnorm_lm.data.errors import DataError
from resnorm_lm.registry import Registry

if TYPE_CHECKING:
    import datasets

SPLITS = ("train", "validation", "test")

CORPORA: Registry[type[Corpus]] = Registry("corpus", plural="corpora")

_TRAILING_SPACE = re.compile(r"[ \t\f\v]+$", re.MULTILINE)


def register_corpus(name: str) -> Callable[[type[Corpus]], type[Corpus]]:
    """Class decorator: register under ``name`` and set ``cls.name``."""

    def add(cls: type[Corpus]) -> type[Corpus]:
        cls.name = name
        return CORPORA.register(name)(cls)

    return add


def normalize_document(text: str) -> str:
    """Line endings to ``\\n``, trailing whitespace stripped per line, no blank lines at either end."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _TRAILING_SPACE.sub("", text).strip("\n")


@dataclass(frozen=True)
class CorpusDocuments:
    """Normalized documents per split, and a sha256 over them and the corpus settings."""

    name: str
    splits: dict[str, list[str]]  # split -> documents
    fingerprint: str
    notes: str = ""  # how splits were made when the source does not define them


def carve_tail(docs: list[str], count: int) -> tuple[list[str], list[str]]:
    """Split off the last ``count`` documents: ``(kept, carved)``; deterministic by order."""
    return docs[: len(docs) - count], docs[len(docs) - count :]


class Corpus(ABC):
    """A named text corpus; subclasses register with ``@register_corpus(name)`` and implement two methods."""

    name: ClassVar[str] = ""  # set by @register_corpus
    options: ClassVar[tuple[str, ...]] = ()  # keyword options the constructor accepts
    notes: ClassVar[str] = ""

    def __init__(self, cache: DataCache) -> None:
        self.cache = cache

    @abstractmethod
    def source_key(self) -> dict[str, Any]:
        """Cheap identity of the source and settings, computed without downloading: the cache key."""

    def settings(self) -> dict[str, Any]:
        """Settings that change the documents (part of the fingerprint); none by default."""
        return {}

    def revision(self) -> str | None:
        """The pinned upstream revision the documents are read at (a Hub commit), recorded in the manifest;
        None where the source pins itself (an archive's sha256) or is local files."""
        return None

    @abstractmethod
    def load_dataset(self) -> datasets.DatasetDict:
        """The splits ``train``, ``validation``, ``test``, each with a ``text`` column, one document a row."""

    def documents(self) -> CorpusDocuments:
        dataset = self.load_dataset()
        missing = [s for s in SPLITS if s not in dataset]
        if missing:
            raise DataError(f"corpus {self.name!r} has no split(s) {missing}; a corpus needs {list(SPLITS)}")
        splits = {}
        for split in SPLITS:
            docs = (normalize_document(t) for t in dataset[split]["text"])
            splits[split] = [d for d in docs if d]
        if not any(splits.values()):
            raise DataError(f"corpus {self.name!r} is empty: no document has any text")
        for split, docs in splits.items():
            if not docs:
                raise DataError(
                    f"split {split!r} of corpus {self.name!r} is empty (no document has text); "
                    "give it text or leave the split out so it is carved from train"
                )
        return CorpusDocuments(self.name, splits, fingerprint(self.name, self.settings(), splits), self.notes)


def fingerprint(name: str, settings: dict[str, Any], splits: dict[str, list[str]]) -> str:
    """sha256 over the corpus name, its settings and every normalized document of every split."""
    h = hashlib.sha256()
    h.update(repr((name, sorted(settings.items()))).encode())
    for split in SPLITS:
        docs = splits[split]
        h.update(f"\0{split}\0{len(docs)}\0".encode())
        for doc in docs:
            data = doc.encode("utf-8")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
    return h.hexdigest()


def build_corpus(name: str, cache: DataCache | None = None, **options: Any) -> Corpus:
    """The corpus registered as ``name``; options left as None are ignored, others must apply to it."""
    cls = CORPORA.get(name)
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - set(cls.options))
    if unknown:
        hint = " (data.files applies to data.corpus=text)" if "files" in unknown else ""
        raise DataError(
            f"option(s) {unknown} do not apply to corpus {name!r}; it takes {list(cls.options) or 'none'}{hint}"
        )
    return cls(cache or DataCache(), **given)

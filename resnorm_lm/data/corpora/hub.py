"""Corpora on the Hugging Face Hub, loaded with ``datasets.load_dataset``.

``path`` defaults to the Hub name and may point at a local mirror with the same
layout (used by the tests). When the Hub cannot be reached (no network,
``HF_HUB_OFFLINE=1``, nothing cached) a :class:`CorpusUnavailableError` says so
and names the offline alternatives.

Each Hub corpus is read at a pinned commit of its dataset repository
(``hub_revision``, passed as ``load_dataset(revision=...)``), so a dataset
edited upstream is never silently another corpus. The revision is part of the
cache key, of the prepared manifest and of every checkpoint's data identity.
A local mirror has no revision: its documents' fingerprint identifies it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any, ClassVar

from resnorm_lm.data.cache import DataCache
from resnorm_lm.data.corpora.base import Corpus, carve_tail, register_corpus
from resnorm_lm.data.errors import CorpusUnavailableError


def _hub_errors() -> tuple[type[BaseException], ...]:
    """Exceptions meaning "could not fetch": connection, offline mode, HTTP, not found."""
    errors: list[type[BaseException]] = [OSError]  # ConnectionError, FileNotFoundError, requests errors
    with contextlib.suppress(ImportError):
        from huggingface_hub.errors import HfHubHTTPError

        errors.append(HfHubHTTPError)
    with contextlib.suppress(ImportError):
        import httpx

        errors.append(httpx.HTTPError)
    with contextlib.suppress(ImportError):
        from datasets.exceptions import DatasetNotFoundError

        errors.append(DatasetNotFoundError)
    return tuple(errors)


class HubCorpus(Corpus):
    """A corpus read with ``load_dataset(path, hub_config, revision=hub_revision)``."""

    hub_path: ClassVar[str]
    hub_config: ClassVar[str | None] = None
    hub_revision: ClassVar[str]  # the dataset repository's commit sha: what "this corpus" means
    options = ("path",)

    def __init__(self, cache: DataCache, path: str | None = None) -> None:
        super().__init__(cache)
        self.path = path or self.hub_path
        if os.path.exists(self.path):
            self.path = os.path.abspath(self.path)

    def revision(self) -> str | None:
        return self.hub_revision if self.path == self.hub_path else None  # a local mirror has none

    def source_key(self) -> dict[str, Any]:
        return {"path": self.path, "config": self.hub_config, "revision": self.revision(), **self.settings()}

    @contextlib.contextmanager
    def _reaching_hub(self) -> Iterator[None]:
        try:
            yield
        except _hub_errors() as e:
            source = "the Hugging Face Hub" if self.path == self.hub_path else f"the dataset at {self.path}"
            reason = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            raise CorpusUnavailableError(self.name, reason, source=source) from e

    def _load(self, **kwargs: Any):
        import datasets

        with self._reaching_hub():
            return datasets.load_dataset(
                self.path, self.hub_config, revision=self.revision(), cache_dir=str(self.cache.hf_datasets), **kwargs
            )


_ARTICLE_TITLE = re.compile(r"^ = [^=].* = $")  # " = Title = " (sections are " = = Title = = ")


def group_wikitext_articles(lines: list[str]) -> list[str]:
    """WikiText rows are lines; an article starts at each top-level `` = Title = `` line."""
    articles: list[list[str]] = []
    for line in lines:
        if _ARTICLE_TITLE.match(line.rstrip("\n")) or not articles:
            articles.append([])
        articles[-1].append(line)
    return ["".join(a) for a in articles]


class WikiTextCorpus(HubCorpus):
    """WikiText raw (Merity et al. 2016); documents are articles, splits as published."""

    hub_path = "Salesforce/wikitext"
    hub_revision = "b08601e04326c79dfdd32d625aee71d232d685c3"

    def settings(self) -> dict[str, Any]:
        return {"documents": "articles"}

    def load_dataset(self):
        import datasets

        raw = self._load()
        return datasets.DatasetDict(
            {s: datasets.Dataset.from_dict({"text": group_wikitext_articles(raw[s]["text"])}) for s in raw}
        )


@register_corpus("wikitext-103")
class WikiText103(WikiTextCorpus):
    hub_config = "wikitext-103-raw-v1"


@register_corpus("wikitext-2")
class WikiText2(WikiTextCorpus):
    hub_config = "wikitext-2-raw-v1"


@register_corpus("tinystories")
class TinyStories(HubCorpus):
    """TinyStories (Eldan & Li 2023): train as published; the published validation split is cut in
    two by order: its first half is our validation, its second half our test."""

    hub_path = "roneneldan/TinyStories"
    hub_revision = "f54c09fd23315a6f9c86f9dc80f725de7d8f9c64"
    notes = "test = second half of the published validation split (by order); validation = first half"

    def settings(self) -> dict[str, Any]:
        return {"test": "second half of validation"}

    def load_dataset(self):
        import datasets

        raw = self._load()
        validation, test = carve_tail(list(raw["validation"]["text"]), len(raw["validation"]) // 2)
        return datasets.DatasetDict(
            {
                "train": raw["train"].select_columns(["text"]),
                "validation": datasets.Dataset.from_dict({"text": validation}),
                "test": datasets.Dataset.from_dict({"text": test}),
            }
        )


@register_corpus("fineweb-edu")
class FineWebEdu(HubCorpus):
    """A prefix of FineWeb-Edu ``sample-10BT``, streamed until ``max_chars`` characters.

    Document i of the stream goes to validation when ``i % 100 == 0``, to test when
    ``i % 100 == 1``, else to train (2% held out, deterministic by stream order).
    """

    hub_path = "HuggingFaceFW/fineweb-edu"
    hub_config = "sample-10BT"
    hub_revision = "87f09149ef4734204d70ed1d046ddc9ca3f2b8f9"
    options = ("path", "max_chars")
    notes = "streamed prefix; document i -> validation if i % 100 == 0, test if i % 100 == 1, else train"
    DEFAULT_MAX_CHARS = 200_000_000  # about 45M GPT-2 tokens

    def __init__(self, cache: DataCache, path: str | None = None, max_chars: int | None = None) -> None:
        super().__init__(cache, path)
        self.max_chars = int(max_chars or self.DEFAULT_MAX_CHARS)
        if self.max_chars < 1:
            raise ValueError(f"data.max_chars must be >= 1, got {self.max_chars}")

    def settings(self) -> dict[str, Any]:
        return {"max_chars": self.max_chars, "split_rule": "i % 100: 0 -> validation, 1 -> test"}

    def load_dataset(self):
        import datasets
        from tqdm.auto import tqdm

        columns: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
        chars = 0
        with self._reaching_hub(), tqdm(total=self.max_chars, unit="char", unit_scale=True, desc="fineweb-edu") as bar:
            for i, row in enumerate(self._load(split="train", streaming=True)):
                split = {0: "validation", 1: "test"}.get(i % 100, "train")
                columns[split].append(row["text"])
                chars += len(row["text"])
                bar.update(len(row["text"]))
                if chars >= self.max_chars:
                    break
        return datasets.DatasetDict({s: datasets.Dataset.from_dict({"text": d}) for s, d in columns.items()})

"""Corpora by name: ``CORPORA.get(name)``; importing this package registers them all."""

from resnorm_lm.data.corpora import hub, local, shakespeare  # noqa: F401  (registers)
from resnorm_lm.data.corpora.base import CORPORA, SPLITS, Corpus, CorpusDocuments, build_corpus, normalize_document

__all__ = ["CORPORA", "SPLITS", "Corpus", "CorpusDocuments", "build_corpus", "normalize_document"]

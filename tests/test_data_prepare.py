"""Tokenizer, token bins, manifest, atomic writes and cache validation on a small local corpus."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from resnorm_lm.data import EOT, DataError, TokenizerSettings, prepare, train_tokenizer
from resnorm_lm.data.__main__ import main
from resnorm_lm.data.bins import choose_dtype
from resnorm_lm.data.corpora import normalize_document
from resnorm_lm.data.tokenizer import load_or_train
from tests.data_fixtures import make_documents, write_documents

VOCAB = 400


@pytest.fixture
def corpus_files(tmp_path, monkeypatch):
    """40 generated documents as text files (train; validation/test carved) and a private cache."""
    monkeypatch.setenv("RESNORM_LM_CACHE", str(tmp_path / "cache"))
    paths = write_documents(tmp_path / "txt", make_documents(40))
    return [str(p) for p in paths]


def test_tokenizer_is_deterministic_and_small_enough():
    docs = make_documents(30)
    settings = TokenizerSettings(vocab_size=VOCAB)
    first, second = train_tokenizer(docs, settings), train_tokenizer(docs, settings)
    assert first.to_str() == second.to_str()
    assert first.get_vocab_size() <= VOCAB
    assert first.token_to_id(EOT) is not None
    text = "Zebras quoth: naïve café ✓"  # unseen words and non-ASCII still encode, byte-level
    assert first.decode(first.encode(text).ids) == text
    with pytest.raises(DataError, match="vocab_size must be >= 257"):
        TokenizerSettings(vocab_size=100)


def test_prepare_writes_bins_and_manifest(corpus_files):
    prepared = prepare("text", files=corpus_files, vocab_size=VOCAB)
    m = prepared.manifest
    assert m.dtype == "uint16" and m.vocab_size <= VOCAB and m.format_version == 1
    assert {s: st.documents for s, st in m.splits.items()} == {"train": 36, "validation": 2, "test": 2}
    docs = [normalize_document(d) for d in make_documents(40)]
    per_split = {"train": docs[:36], "validation": docs[36:38], "test": docs[38:]}
    tokenizer = prepared.tokenizer
    for split, split_docs in per_split.items():
        tokens = prepared.tokens(split)
        stats = m.splits[split]
        assert os.path.getsize(prepared.paths[split]) == stats.tokens * 2 == tokens.size * 2
        assert int(tokens.max()) < VOCAB
        assert stats.bytes == sum(len(d.encode()) for d in split_docs)
        assert stats.words == sum(len(d.split()) for d in split_docs)
        # each document is followed by <|endoftext|>, so the EOTs separate documents exactly
        ends = np.flatnonzero(tokens == m.eot_id)
        assert len(ends) == len(split_docs) and ends[-1] == tokens.size - 1
        pieces = np.split(np.asarray(tokens), ends[:-1] + 1)
        assert [tokenizer.decode(p[:-1].tolist()) for p in pieces] == split_docs
    saved = json.loads((prepared.folder / "manifest.json").read_text())
    assert saved["corpus_fingerprint"] == m.corpus_fingerprint and saved["splits"]["train"]["tokens"] > 0


def test_prepare_is_cached_and_reproducible(corpus_files, tmp_path, monkeypatch):
    first = prepare("text", files=corpus_files, vocab_size=VOCAB)
    with monkeypatch.context() as m:
        m.setattr("resnorm_lm.data.tokenizer.train_tokenizer", lambda *a, **k: pytest.fail("retrained"))
        m.setattr("datasets.load_dataset", lambda *a, **k: pytest.fail("corpus read again"))
        again = prepare("text", files=corpus_files, vocab_size=VOCAB)
    assert again.manifest == first.manifest
    other = prepare("text", files=corpus_files, vocab_size=VOCAB, cache_dir=tmp_path / "other-cache")
    assert other.tokenizer_path.read_bytes() == first.tokenizer_path.read_bytes()
    assert other.manifest.corpus_fingerprint == first.manifest.corpus_fingerprint
    for split in ("train", "validation", "test"):
        assert other.paths[split].read_bytes() == first.paths[split].read_bytes()


def test_interrupted_preparation_never_looks_valid(corpus_files, tmp_path, monkeypatch, capsys):
    real_replace = os.replace

    def killed_before_manifest(src, dst):
        if str(dst).endswith("manifest.json"):
            raise KeyboardInterrupt("killed")
        real_replace(src, dst)

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(os, "replace", killed_before_manifest)
        prepare("text", files=corpus_files, vocab_size=VOCAB)
    (folder,) = (tmp_path / "cache" / "prepared").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["test.bin", "train.bin", "validation.bin"]  # no manifest
    prepared = prepare("text", files=corpus_files, vocab_size=VOCAB)
    assert prepared.folder == folder
    assert "invalid (no manifest.json); rebuilding" in capsys.readouterr().err
    assert not [p for p in prepared.folder.iterdir() if p.name.startswith(".tmp-")]  # temp file cleaned up
    assert prepared.manifest.splits["train"].tokens == prepared.tokens("train").size


@pytest.mark.parametrize("damage", ["truncate-bin", "delete-bin", "tokenizer", "version"])
def test_damaged_cache_is_rebuilt(corpus_files, capsys, damage):
    prepared = prepare("text", files=corpus_files, vocab_size=VOCAB)
    expected = prepared.paths["validation"].read_bytes()
    if damage == "truncate-bin":
        prepared.paths["validation"].write_bytes(expected[:-2])
        reason = "validation.bin has"
    elif damage == "delete-bin":
        prepared.paths["validation"].unlink()
        reason = "validation.bin is missing"
    elif damage == "tokenizer":
        prepared.tokenizer_path.write_text(prepared.tokenizer_path.read_text().replace("Chapter", "Chapters", 1))
        reason = "tokenizer.json does not match"
    else:
        path = prepared.folder / "manifest.json"
        path.write_text(path.read_text().replace('"format_version": 1', '"format_version": 0'))
        reason = "format version 0"
    capsys.readouterr()
    rebuilt = prepare("text", files=corpus_files, vocab_size=VOCAB)
    assert reason in capsys.readouterr().err
    assert rebuilt.paths["validation"].read_bytes() == expected


def test_dtype_and_size_errors(corpus_files):
    assert choose_dtype(65536) == np.uint16 and choose_dtype(65537) == np.uint32
    with pytest.raises(DataError, match="does not fit uint16"):
        choose_dtype(70_000, "uint16")
    with pytest.raises(DataError, match="does not fit uint32"):
        choose_dtype(2**32 + 1)
    with pytest.raises(DataError, match="does not fit uint16"):
        prepare("text", files=corpus_files, vocab_size=70_000, dtype="uint16")
    with pytest.raises(DataError, match="unknown token dtype 'int8'"):
        choose_dtype(300, "int8")


def test_tokenizer_cache_is_keyed_by_fingerprint_and_settings(tmp_path):
    from resnorm_lm.data import DataCache

    cache, docs = DataCache(tmp_path), make_documents(10)
    _, a = load_or_train(cache, "f" * 64, docs, TokenizerSettings(vocab_size=300))
    _, b = load_or_train(cache, "f" * 64, docs, TokenizerSettings(vocab_size=320))
    _, c = load_or_train(cache, "e" * 64, docs, TokenizerSettings(vocab_size=300))
    assert len({a, b, c}) == 3 and all(p.name == "tokenizer.json" for p in (a, b, c))


def test_cli_prints_manifest_or_one_line_error(corpus_files, capsys):
    assert main(["prepare", "--corpus", "text", "--vocab-size", str(VOCAB), "--files", *corpus_files]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["corpus"] == "text" and set(printed["splits"]) == {"train", "validation", "test"}

    assert main(["prepare", "--corpus", "text", "--files", "no/such/file.txt"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: data.files: no file matches 'no/such/file.txt' (looked from {os.getcwd()})"
    assert main(["prepare", "--corpus", "gutenberg"]) == 1
    assert "valid corpora: fineweb-edu, shakespeare, text" in capsys.readouterr().err

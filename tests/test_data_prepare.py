"""Tokenizer, token bins, manifest, atomic writes and cache validation on a small local corpus."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import multiprocessing
import os
import stat
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from resnorm_lm.data import EOT, DataError, TokenizerSettings, prepare, train_tokenizer
from resnorm_lm.data.__main__ import main
from resnorm_lm.data.bins import choose_dtype
from resnorm_lm.data.corpora import normalize_document
from resnorm_lm.data.tokenizer import load_or_train
from tests.smoke import make_documents, write_documents

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
    root = tmp_path / "cache" / "prepared"
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == []  # the private build is gone
    prepared = prepare("text", files=corpus_files, vocab_size=VOCAB)
    # a folder without its manifest (a build killed by an older version, a partial copy) is rebuilt
    (prepared.folder / "manifest.json").unlink()
    capsys.readouterr()
    rebuilt = prepare("text", files=corpus_files, vocab_size=VOCAB)
    assert rebuilt.folder == prepared.folder
    assert "invalid (no manifest.json); rebuilding" in capsys.readouterr().err
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == [prepared.folder.name]  # no leftovers
    assert not [p for p in rebuilt.folder.iterdir() if p.name.startswith(".tmp-")]  # temp files cleaned up
    assert rebuilt.manifest.splits["train"].tokens == rebuilt.tokens("train").size


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


# ---------------------------------------------------------------------- two processes, one cold cache


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")
        time.sleep(0.02)


def prepare_in_a_process(files: list[str], out: Path, locks: bool, paused: Path | None, release: Path | None) -> None:
    """A child process: prepare the corpus and write the folder and a digest of each split's tokens to ``out``.

    With ``paused``, it stops inside the write of its first token bin (after creating the temp file), says so
    by creating ``paused``, and goes on once ``release`` exists. Without ``locks``, it runs as on a file
    system whose locks do not work. Its stderr goes to ``out`` with the suffix .log.
    """
    bins = importlib.import_module("resnorm_lm.data.bins")
    prepare_module = importlib.import_module("resnorm_lm.data.prepare")  # resnorm_lm.data.prepare is the function

    sys.stderr = open(out.with_suffix(".log"), "w", buffering=1)  # closed when the process ends
    if not locks:
        prepare_module.build_lock = lambda target: contextlib.nullcontext()
    if paused is not None:
        real_atomic_write = bins.atomic_write

        @contextlib.contextmanager
        def pausing_atomic_write(path, mode="wb"):
            with real_atomic_write(path, mode) as f:
                if not paused.exists():
                    paused.touch()
                    wait_for(release)
                yield f

        bins.atomic_write = pausing_atomic_write
    prepared = prepare("text", files=files, vocab_size=VOCAB)
    digests = {s: hashlib.sha256(np.asarray(prepared.tokens(s)).tobytes()).hexdigest() for s in prepared.paths}
    out.write_text(json.dumps({"folder": str(prepared.folder), "tokens": digests}))


def prepare_twice_at_once(files: list[str], tmp_path: Path, locks: bool) -> tuple[dict, dict, str, str]:
    """Process A starts preparing and is held inside its first token bin; B then prepares the same corpus
    into the same cache; A goes on when B has finished (without locks) or is waiting for A's lock (with).
    Returns what A and B returned and their stderr."""
    ctx = multiprocessing.get_context("fork")  # the modules are imported already: the children start at once
    paused, release = tmp_path / "a-paused", tmp_path / "release"
    a_out, b_out = tmp_path / "a.json", tmp_path / "b.json"
    a = ctx.Process(target=prepare_in_a_process, args=(files, a_out, locks, paused, release))
    a.start()
    try:
        wait_for(paused)
        b = ctx.Process(target=prepare_in_a_process, args=(files, b_out, locks, None, None))
        b.start()
        if locks:  # hold A until B waits on the lock, or has finished without waiting
            deadline = time.monotonic() + 60
            b_log = b_out.with_suffix(".log")
            while b.is_alive() and "waiting for another process" not in (b_log.read_text() if b_log.exists() else ""):
                assert time.monotonic() < deadline, "B neither waited nor finished"
                time.sleep(0.02)
        else:
            b.join(60)
        release.touch()
        b.join(60)
    finally:
        release.touch()
        a.join(60)
    logs = a_out.with_suffix(".log").read_text(), b_out.with_suffix(".log").read_text()
    assert (a.exitcode, b.exitcode) == (0, 0), logs
    return json.loads(a_out.read_text()), json.loads(b_out.read_text()), *logs


def test_two_processes_prepare_one_cold_cache_without_working_locks(corpus_files, tmp_path, capsys):
    """B builds and publishes the whole corpus while A is in the middle of its build; A's build must survive
    B (B must not take it for a crashed one), then lose the race and use B's folder."""
    a, b, a_log, b_log = prepare_twice_at_once(corpus_files, tmp_path, locks=False)
    assert a == b  # one folder, the same tokens
    assert "invalid" not in a_log + b_log  # neither saw the other's work in progress
    prepared = prepare("text", files=corpus_files, vocab_size=VOCAB)  # valid: used as it is
    assert str(prepared.folder) == a["folder"] and "rebuilding" not in capsys.readouterr().err
    root = prepared.folder.parent
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == [prepared.folder.name]


def test_two_processes_prepare_one_cold_cache_with_a_lock_build_once(corpus_files, tmp_path):
    a, b, a_log, b_log = prepare_twice_at_once(corpus_files, tmp_path, locks=True)
    assert a == b
    assert "waiting for another process that is preparing" in b_log
    assert "training byte-level BPE" in a_log and "training byte-level BPE" not in b_log  # built once
    assert "tokenize train" not in b_log


# ---------------------------------------------------------------------- file modes


@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask022", "umask002"])
def test_written_files_get_the_mode_open_gives(corpus_files, tmp_path, umask):
    """Token bins, tokenizer, manifest, eval.json, tables and checkpoints: 0o666 less the umask (not 0600),
    so a cache or results folder shared on a cluster stays readable to the others."""
    from resnorm_lm.data.cache import atomic_write, write_csv_atomic, write_json_atomic
    from resnorm_lm.train.checkpoint_io import AtomicCheckpointIO

    before = os.umask(umask)
    try:
        prepared = prepare("text", files=corpus_files, vocab_size=VOCAB)
        write_json_atomic(tmp_path / "run" / "eval.json", {"val_loss": 1.0})
        write_csv_atomic(tmp_path / "results" / "compare.csv", [{"recipe": "prenorm-12l"}])
        with atomic_write(tmp_path / "results" / "compare.md", "w") as f:
            f.write("# table\n")
        AtomicCheckpointIO().save_checkpoint({"step": 1}, tmp_path / "run" / "checkpoints" / "last.ckpt")
    finally:
        os.umask(before)
    files = [*prepared.paths.values(), prepared.folder / "manifest.json", prepared.tokenizer_path]
    files += [tmp_path / "run" / "eval.json", tmp_path / "run" / "checkpoints" / "last.ckpt"]
    files += [tmp_path / "results" / "compare.csv", tmp_path / "results" / "compare.md"]
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {str(p): oct(0o666 & ~umask) for p in files}
    assert oct(stat.S_IMODE(prepared.folder.stat().st_mode)) == oct(0o777 & ~umask)  # the published build folder


def test_publishing_never_deletes_a_valid_folder_published_after_it_was_judged(tmp_path):
    """A folder judged invalid and then, before it is moved aside, replaced by another process's valid one:
    the valid one stays (the judgement was about a different folder)."""
    from resnorm_lm.data.cache import private_folder, publish_folder

    target = tmp_path / "prepared" / "text-key"
    target.mkdir(parents=True)
    (target / "train.bin").write_bytes(b"half")  # a crashed build: invalid
    calls = []

    def is_valid(folder: Path) -> bool:
        calls.append(folder)
        if len(calls) == 1:  # meanwhile another process replaces the invalid folder with its valid one
            theirs = tmp_path / "prepared" / ".build-theirs"
            theirs.mkdir()
            (theirs / "manifest.json").write_text("theirs")
            os.rename(target, tmp_path / "prepared" / ".invalid-theirs-moved-it")
            os.rename(theirs, target)
            return False
        return (folder / "manifest.json").exists()

    with private_folder(target) as build:
        (build / "manifest.json").write_text("ours")
        assert publish_folder(build, target, is_valid) is False  # theirs is in place: ours is discarded
        assert not build.exists()
    assert (target / "manifest.json").read_text() == "theirs" and len(calls) == 2
    assert sorted(p.name for p in target.parent.iterdir()) == [".invalid-theirs-moved-it", "text-key"]

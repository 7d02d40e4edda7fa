"""Every committed suite table follows from its committed run files: rendered again from ``run-files/`` with the
code of this revision (``resnorm-lm suite <name> --root <run-files> --no-train``), each table and CSV beside it
comes out byte for byte the same, apart from the line that says when it was rendered.

So a headline number cannot be a hand edit, a table left stale by a change to the analysis, or one rendered from
runs that were never committed: a change meant to change no table must pass this, and a change that does change
one re-renders and commits it (the command is in the failure). The figures are left out (the tables are their
data). Nothing is written where the files are: the run files hold no checkpoints, so nothing is evaluated again.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from resnorm_lm.analysis.suite import SUITES_DIR, load
from resnorm_lm.cli import main
from tests.results_files import REPO, RESULTS

RENDERED = re.compile(r"^Rendered \d{4}-\d\d-\d\d \d\d:\d\d", re.MULTILINE)  # the render's date and time


def committed_suites() -> list[tuple[str, str]]:
    """(results folder, suite name) of every committed suite table with run files beside it, each base suite
    before a suite whose equal-compute table reads it."""
    found = [
        (results.name, folder.name)
        for results in sorted(RESULTS.glob("suites*"))
        for folder in sorted(results.iterdir())
        if (folder / "run-files").is_dir() and (SUITES_DIR / f"{folder.name}.yaml").is_file()
    ]
    return sorted(found, key=lambda found: load(found[1]).compute_of is not None)


SUITES = committed_suites()


def undated(text: str) -> str:
    return RENDERED.sub("Rendered <when>", text)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    """Every committed suite rendered again into a scratch results folder of the same layout."""
    out = tmp_path_factory.mktemp("rendered")
    for results, name in SUITES:
        run_files = RESULTS / results / name / "run-files"
        argv = ["suite", name, "--root", str(run_files), "--no-train", "--results", str(out / results)]
        assert main(argv) == 0, f"resnorm-lm {' '.join(argv)} failed"
    return out


def test_the_committed_suites_are_found():
    """The discovery finds the suites the docs cite, so the test below cannot pass by checking nothing."""
    suites = committed_suites()
    assert ("suites", "placements-12l") in suites and ("suites-h100", "placements-12l") in suites
    assert suites.index(("suites", "designs-12l")) < suites.index(("suites", "designs-12l-equal-flops-hc"))


@pytest.mark.parametrize(("results", "name"), SUITES, ids=[f"{r}/{n}" for r, n in SUITES])
def test_a_committed_suite_table_is_what_its_run_files_render(rendered, results, name):
    committed = RESULTS / results / name
    again = rendered / results / name
    tables = sorted(p.name for p in committed.iterdir() if p.suffix in (".md", ".csv"))
    assert f"{name}.md" in tables
    stale = [
        t
        for t in tables
        if not (again / t).is_file() or undated((again / t).read_text()) != undated((committed / t).read_text())
    ]
    command = (
        f"python -m resnorm_lm suite {name} --root {(committed / 'run-files').relative_to(REPO)} --no-train "
        f"--results {committed.parent.relative_to(REPO)}"
    )
    assert not stale, (
        f"{', '.join(stale)} of {committed.relative_to(REPO)} differ from a render of its run files: {command}"
    )

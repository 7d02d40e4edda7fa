"""The house rules a newcomer can check: every module of the package short and saying what it holds, one atomic
writer, one FLOPs formula, one reader of run directories. Each test names the file that breaks its rule."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "resnorm_lm"
# A guide, not a cap to split one concern over files by (a module is one concern, not a share of a line budget):
# a module this long holds several, and the test names it.
MAX_LINES = 700


def sources(*folders: str) -> dict[str, str]:
    """{path relative to the repository: text} of every .py file under ``folders``."""
    return {
        str(path.relative_to(REPO)): path.read_text()
        for folder in folders
        for path in sorted((REPO / folder).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def lines_matching(pattern: str, *folders: str) -> dict[str, list[str]]:
    """{file: [matching lines]} for every file with a line that matches ``pattern`` (comments included)."""
    found = {}
    for path, text in sources(*folders).items():
        hits = [line.strip() for line in text.splitlines() if re.search(pattern, line)]
        if hits:
            found[path] = hits
    return found


# The size guide is a guide: a module that holds one concern may pass it when it says so here, never the ceiling.
ONE_CONCERN_LONGER = {
    "resnorm_lm/analysis/compare.py": "the compare command and the report it writes (compare.md, CSVs, figures)",
}
CEILING = 1000


def test_every_module_is_short_and_its_docstring_says_what_it_holds():
    lengths = {p: len(t.splitlines()) for p, t in sources("resnorm_lm").items()}
    too_long = {p: n for p, n in lengths.items() if n > MAX_LINES and p not in ONE_CONCERN_LONGER}
    assert not too_long, f"modules over {MAX_LINES} lines (each holds several concerns: split them): {too_long}"
    over_ceiling = {p: n for p, n in lengths.items() if n > CEILING}
    assert not over_ceiling, f"modules over {CEILING} lines, whatever they hold: {over_ceiling}"
    stale = [p for p in ONE_CONCERN_LONGER if lengths.get(p, 0) <= MAX_LINES]
    assert not stale, f"listed as longer than the guide but no longer are (remove them): {stale}"
    silent = [p for p, t in sources("resnorm_lm").items() if not (ast.get_docstring(ast.parse(t)) or "").strip()]
    assert not silent, f"modules without a docstring saying what they hold: {silent}"


def test_one_atomic_writer():
    """Temp file then rename lives in resnorm_lm/data/cache.py (``atomic_write`` and the cache folder's publish);
    everything else writes through it."""
    renames = lines_matching(r"\bos\.(replace|rename)\(|\.rename\(|\.replace\((tmp|temp)", "resnorm_lm", "benchmarks")
    assert set(renames) == {"resnorm_lm/data/cache.py"}, f"renames outside the one atomic writer: {renames}"


def test_one_flops_formula():
    """6N + 12 L C T per token is written once, in ``GPT.flops_per_token``; the rest call it."""
    formulas = lines_matching(r"\b6 \* .*(param|num_parameters)", "resnorm_lm", "benchmarks")
    assert set(formulas) == {"resnorm_lm/model/gpt.py"}, f"FLOPs formulas outside GPT.flops_per_token: {formulas}"


RUN_FILES = r"\"(eval\.json|config\.yaml|last\.ckpt|manifest\.json|metrics\.csv)\""
NOT_RUN_DIRECTORIES = {  # files that name the same file names for something other than a run directory
    "resnorm_lm/data/bins.py": "the token bins' own manifest.json",
    "resnorm_lm/data/prepare.py": "the token bins' own manifest.json",
    "resnorm_lm/train/callbacks.py": "the CSV logger continuing the metrics.csv it writes",
}


def test_one_reader_of_run_directories():
    """A run directory's file names appear in ``RunDir`` (resnorm_lm/train/runs.py) only: every reader goes
    through it."""
    readers = set(lines_matching(RUN_FILES, "resnorm_lm", "benchmarks")) - set(NOT_RUN_DIRECTORIES)
    assert readers == {"resnorm_lm/train/runs.py"}, f"run directories read outside RunDir: {sorted(readers)}"


def test_the_rules_can_fail(tmp_path, monkeypatch):
    """Each rule finds a file that breaks it (so a passing test means the tree keeps it)."""
    (tmp_path / "resnorm_lm").mkdir()
    (tmp_path / "resnorm_lm" / "bad.py").write_text(
        'import os\nos.replace(a, b)\nflops = 6 * num_parameters\npath = run / "eval.json"\n' + "x = 1\n" * MAX_LINES
    )
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert list(lines_matching(r"\bos\.(replace|rename)\(", "resnorm_lm")) == ["resnorm_lm/bad.py"]
    assert list(lines_matching(r"\b6 \* .*(param|num_parameters)", "resnorm_lm")) == ["resnorm_lm/bad.py"]
    assert list(lines_matching(RUN_FILES, "resnorm_lm")) == ["resnorm_lm/bad.py"]
    (text,) = sources("resnorm_lm").values()
    assert len(text.splitlines()) > MAX_LINES and not ast.get_docstring(ast.parse(text))

"""Every result number in README.md and docs/*.md is in the results file its section links (tests/doc_numbers.py),
and the checker reports a number that is not: wrong, a pair from two rows, a machine left unnamed."""

from __future__ import annotations

import pytest

from tests import doc_numbers
from tests.doc_numbers import Section, check, quotes
from tests.unchecked_numbers import SETTING, Unchecked

OLD_DEFAULT = "`docs/results/cpu-old-default/cpu/compare.md`"  # pre-norm at 2e-3/50: val bpb 2.3923794 (EPYC)
H100 = "[compare.md](docs/results/h100/cpu/compare.md)"  # pre-norm 5.015 ± 0.006, post-norm 5.535 ± 0.009


def problems_in(tmp_path, text: str) -> list[str]:
    doc = tmp_path / "page.md"
    doc.write_text(text)
    return [str(p) for p in check([doc]).problems]


def test_every_quoted_number_is_in_its_file():
    report = check()
    assert len(report.passed) > 500  # the finder finds
    assert [str(p) for p in report.problems] == []
    assert report.unused == [], "entries of tests/unchecked_numbers.py that name no number any more"


def test_a_wrong_number_is_reported_with_where_it_looked(tmp_path):
    text = f"# Old default\n\nOn the AMD EPYC ({OLD_DEFAULT}), pre-norm at 2e-3/50 reaches val bpb {{}}.\n"
    assert problems_in(tmp_path, text.format("2.392")) == []
    assert problems_in(tmp_path, text.format("2.3965")) == [
        "page.md:3: 2.3965: no value rounds to it in docs/results/cpu-old-default/cpu/compare.md"
    ]
    # more digits than compare.md prints: they are in the folder's compare.csv, not in compare.md
    assert problems_in(tmp_path, text.format("2.3924")) == [
        "page.md:3: 2.3924: no value rounds to it in docs/results/cpu-old-default/cpu/compare.md"
    ]
    folder = text.replace(OLD_DEFAULT, "`docs/results/cpu-old-default/cpu/`")
    assert problems_in(tmp_path, folder.format("2.3924")) == []


def test_a_number_with_no_linked_file_is_reported(tmp_path):
    assert problems_in(tmp_path, "# Somewhere\n\nOn the H100, pre-norm reaches 5.015.\n") == [
        "page.md:3: 5.015: no value rounds to it in no results file linked"
    ]


def test_a_mean_and_a_std_from_two_rows_are_reported(tmp_path):
    text = f"# Ten placements\n\nOn the H100 ({H100}): pre-norm {{}}.\n"
    assert problems_in(tmp_path, text.format("5.015 ± 0.006")) == []
    assert problems_in(tmp_path, text.format("5.015 ± 0.009")) == [  # post-norm's std
        "page.md:3: 5.015 ± 0.009: no (mean, std) pair rounds to it in docs/results/h100/cpu/compare.md"
    ]


def test_a_paired_difference_is_its_mean_with_its_own_half_width(tmp_path):
    # pairs.csv: Block AttnRes ahead of AttnRes by 0.0230 (half width 0.0200); ahead of pre-norm by 0.0126 (0.0318)
    text = "# Block AttnRes\n\nOn the EPYC ([pairs.csv](docs/results/suites/designs-12l/pairs.csv)): ahead by {}.\n"
    assert problems_in(tmp_path, text.format("0.023 ± 0.020")) == []
    assert problems_in(tmp_path, text.format("0.023 ± 0.032")) == [
        "page.md:3: 0.023 ± 0.032: no (mean, std) pair rounds to it in docs/results/suites/designs-12l/pairs.csv"
    ]


def test_seeds_beside_a_mean_must_give_it(tmp_path):
    text = "# Depth\n\nOn the EPYC (`docs/results/cpu-depth-partial/`), pre-norm at 24 blocks: 5.051 ± 0.012 ({}).\n"
    assert problems_in(tmp_path, text.format("5.065, 5.042, 5.046")) == []
    wrong = problems_in(tmp_path, text.format("5.065, 5.042, 5.146"))  # the seeds no longer count as filed
    assert "page.md:3: 5.146: no value rounds to it in docs/results/cpu-depth-partial" in wrong


def test_a_gap_must_be_the_difference_of_two_quoted_numbers(tmp_path):
    text = f"# Literature\n\nOn the H100 ({H100}), pre-norm leads post-norm by {{}} nats (5.015 against 5.535).\n"
    assert problems_in(tmp_path, text.format("0.52")) == []
    assert problems_in(tmp_path, text.format("0.520")) == []
    assert problems_in(tmp_path, text.format("0.527")) == [
        "page.md:3: 0.527: no value rounds to it in docs/results/h100/cpu/compare.md"
    ]


def test_the_machine_must_be_named(tmp_path):
    assert problems_in(tmp_path, f"# Ten placements\n\nPre-norm ({H100}): 5.015 ± 0.006.\n") == [
        "page.md:3: 5.015 ± 0.006: measured on H100, not named in its section"
    ]
    # two machines in one section: each paragraph names its own
    both = "# Old default\n\nOn the EPYC ({}), pre-norm gives 2.392.\n\nOn the H100 ({}), {} 5.015 ± 0.006.\n"
    assert problems_in(tmp_path, both.format(OLD_DEFAULT, H100, "pre-norm gives")) == []
    assert problems_in(tmp_path, both.format(OLD_DEFAULT, H100, "the GPU gives")) == []  # the section's one GPU
    assert problems_in(tmp_path, both.format(OLD_DEFAULT, H100, "it gives").replace("On the H100 ", "Then ")) == [
        "page.md:5: 5.015 ± 0.006: measured on H100, not named in its paragraph, list or table"
    ]


@pytest.mark.parametrize(
    "prose",
    [
        "`--trainer.gradient_clip_val=0.5`",  # code
        "an LR of 2.5e-4",  # scientific notation: a setting
        "torch 2.13.0 and Python 3.12",  # versions
        "arXiv 2003.04887",
        "0.55 s a step, 1.8x-2.6x, 3997 tokens/s, 1.02M tokens, 16.5-17.5 minutes",  # timings and sizes
        "[a link](results/h100/cpu/compare.md)",
    ],
)
def test_what_is_not_a_quoted_result(prose):
    assert quotes(section_of(prose)) == []


def test_a_result_in_inline_code_is_quoted():
    (quote,) = quotes(section_of("it ends with `val_bpb=2.3965` here"))
    assert (quote.text, quote.number.value, quote.number.decimals) == ("val_bpb=2.3965", 2.3965, 4)


def test_an_unused_unchecked_entry_is_reported(monkeypatch):
    stale = Unchecked(SETTING, "README.md", "a setting of 0.123 that no doc has", "a test's entry")
    monkeypatch.setattr(doc_numbers, "UNCHECKED", [*doc_numbers.UNCHECKED, stale])
    assert check([doc_numbers.REPO / "README.md"]).unused[-1] == stale


def section_of(line: str) -> Section:
    return Section("page.md", "", 1, lines=[(1, line)])

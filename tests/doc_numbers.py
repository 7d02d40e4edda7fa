"""Every result number README.md and docs/*.md quote, checked against the results file it comes from.

A result (a loss, a perplexity, bits per byte, a seed standard deviation, a gap between two of them, a gradient
norm at init, a block's contribution) is measured once, written under ``docs/results/`` by the command that
measured it (``compare``, ``eval``, ``at-init``), and quoted from there. This module finds every quoted result
and looks it up in the files its section links (``tests/results_files.py`` reads them);
``tests/test_doc_numbers.py`` runs it, and ``python -m tests.doc_numbers --verbose`` prints every number and
where it was found. A checker rather than generated tables: the docs stay prose written for a reader, and a
number keeps its sentence.

How to quote a number so that it passes:

1. **Link its file from the section that quotes it**: a markdown link (``[compare.md](results/h100/cpu/compare.md)``)
   or an inline-code path (```docs/results/cpu/```) to a file or folder under ``docs/results/``, anywhere in the
   section (from its heading to the next heading) or in the text of an enclosing section. A folder stands for
   every table under it; a figure (``![...](results/h100/cpu/lr_sensitivity.png)``) for the tables of its folder.
2. **Print it rounded from the file's value**: ``5.01502`` in a ``.csv`` may be quoted as ``5.015`` or ``5.02``;
   a number a ``.md`` table prints as ``5.015`` with as many decimals or fewer, never more.
3. **A mean ± std is one result**: ``5.015 ± 0.006`` must be one (mean, std) pair of a file. Seeds listed in
   brackets right after it, ``5.051 ± 0.012 (5.065, 5.042, 5.046)``, pass when their mean and standard deviation
   give that pair, and may then be quoted again in the section.
4. **A gap is the difference of two numbers the section quotes**, printed with the same decimals: ``0.52 nats``
   beside ``5.015`` and ``5.535``. A gap is under 1.
5. **Name the machine**: every machine whose files a section's numbers come from (``H100``, ``EPYC``, ``Xeon``,
   read from the files' ``Hardware:`` line or manifest) is named in the section or an enclosing one. Where no one
   machine has all of a section's numbers, each paragraph, list or table (a table with its caption and notes)
   names the machine of each number it quotes; there "CPU" names the section's one CPU and "GPU" the H100.

Which numbers count: a decimal with a fractional part (``5.015``, ``0.52``, ``-0.002``) in the prose and tables of
README.md and docs/*.md, and ``val_bpb=2.3271``-style pairs in inline code. Not checked: code (fenced or indented
blocks, other inline code, link targets), scientific notation (learning rates are written ``8e-3``), versions
(``2.13.0``, ``Python 3.12``), arXiv ids, numbers with a unit of time, speed or size or a speed ratio (``0.55 s``,
``1.8x``, ``1.02M``: timings, which ``make bench`` prints), integers and percentages, docs/benchmarks.md (its
numbers are ``make bench``'s output, printed on that page), and the entries of ``tests/unchecked_numbers.py``.
Numbers of one or two decimals are a weak check (many values of a folder round to ``0.18``): quote a result with
three decimals and its seed std where it has one.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.results_files import MACHINES, REPO, RESULTS, Number, Value, machines_of, values_of
from tests.unchecked_numbers import UNCHECKED, Unchecked

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
UNCHECKED_DOCS = {"docs/benchmarks.md"}  # speed: `make bench`'s own output, printed on the page

NUMBER = re.compile(r"\d+\.\d+")
RESULT_KEY = re.compile(r"\b(?:val|test)_(?:loss|ppl|bpb)=(\d+\.\d+)")  # `val_bpb=2.3271` in inline code
STD = re.compile(r"\s*±\s*(\d+\.\d+)")
SEEDS = re.compile(r"\**\s*\(([^()]*)\)")
UNIT = re.compile(
    r"\s?(?:s|ms|us|µs|min|minutes?|h|hours?|seconds?|x|GB|GiB|MB|MiB|KB|M|k|B|TB|GFLOP/s|TFLOP/s|tokens/s|it/s|%)"
    r"(?![\w/])"
)


@dataclass(frozen=True)
class Quote:
    """A number a doc quotes: where, the text as printed, and its std when it is a mean ± std."""

    doc: str
    line: int
    line_text: str  # the whole line as the doc prints it
    text: str  # "5.015 ± 0.006", "val_bpb=2.3271", "-0.002"
    number: Number
    std: Number | None
    seeds: tuple[Number, ...]  # the seeds in brackets right after a mean ± std
    block: int  # which paragraph, list or table of its section it is in


@dataclass
class Section:
    """The text from a heading to the next heading, code removed, and the results files it links."""

    doc: str
    title: str
    level: int
    lines: list[tuple[int, str]] = field(default_factory=list)  # (line number, the line as printed)
    links: list[Path] = field(default_factory=list)
    parents: list[Section] = field(default_factory=list)

    @property
    def sources(self) -> tuple[Path, ...]:
        return tuple(dict.fromkeys([*self.links, *(p for parent in self.parents for p in parent.links)]))

    @property
    def text(self) -> str:
        """Its heading and prose with its enclosing sections': where a machine is named (not in code)."""
        return " ".join(
            without_code(t) for s in [self, *self.parents] for t in [s.title, *(line for _, line in s.lines)]
        )


# ---------------------------------------------------------------- reading the docs


def doc_name(doc: Path) -> str:
    return doc.relative_to(REPO).as_posix() if doc.is_relative_to(REPO) else doc.name


def sections(doc: Path) -> list[Section]:
    name = doc_name(doc)
    found = [Section(name, "", 0)]
    stack: list[Section] = []
    fenced, previous_blank, indented = False, True, False
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, indented = not fenced, False
            continue
        indented = not fenced and line.startswith(("    ", "\t")) and (previous_blank or indented)
        previous_blank = not line.strip()
        if fenced or indented:
            continue
        heading = re.match(r"^(#+)\s+(.*)", line)
        if heading:
            level = len(heading.group(1))
            stack = [s for s in stack if s.level < level]
            found.append(Section(name, heading.group(2), level, parents=list(stack)))
            stack.append(found[-1])
            continue
        targets = re.findall(r"\]\(([^)\s]+)\)", line)
        spans = re.findall(r"`([^`]+)`", line)
        found[-1].links += [path for path in (result_path(t, doc) for t in [*targets, *spans]) if path]
        found[-1].lines.append((number, line))
    return found


def result_path(target: str, doc: Path) -> Path | None:
    """A link target or inline-code path that names something under docs/results/ (not the folder itself, which
    names every result), resolved; else None."""
    target = target.split("#")[0].strip()
    if not target or "://" in target:
        return None
    for base in (doc.parent, REPO):
        path = (base / target).resolve()
        if path.is_relative_to(RESULTS) and path != RESULTS and path.exists():
            return path
    return None


def quotes(section: Section) -> list[Quote]:
    out: list[Quote] = []
    block = 0
    for number, line in section.lines:
        if not line.strip():
            block += 1
            continue
        for span in re.findall(r"`([^`]+)`", line):
            for match in RESULT_KEY.finditer(span):
                value = Number.parse(match.group(1))
                out.append(Quote(section.doc, number, line, match.group(0), value, None, (), block))
        out += numbers_in(without_code(line), section.doc, number, line, block)
    return out


def without_code(line: str) -> str:
    """The line with inline code, link targets and comments blanked."""
    return re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]+`", "``", re.sub(r"<!--.*?-->", "", line)))


def numbers_in(prose: str, doc: str, number: int, line: str, block: int) -> list[Quote]:
    out, position = [], 0
    for match in NUMBER.finditer(prose):
        start, end = match.span()
        if start < position or not is_result(prose, start, end):
            continue
        signed = start > 0 and prose[start - 1] in "+-−" and (start < 2 or not prose[start - 2].isalnum())
        text = prose[start - 1 : end] if signed else match.group()
        std_match, std, seeds, position = STD.match(prose, end), None, (), end
        if std_match:
            std, position = Number.parse(std_match.group(1)), std_match.end()
            text = f"{text} ± {std_match.group(1)}"
            seed_match = SEEDS.match(prose, position)
            if seed_match:
                seeds = tuple(Number.parse(n) for n in NUMBER.findall(seed_match.group(1)))
        out.append(Quote(doc, number, line, text, Number.parse(text.split(" ")[0]), std, seeds, block))
    return out


def is_result(prose: str, start: int, end: int) -> bool:
    before, after = prose[:start], prose[end:]
    if before and (before[-1].isalnum() or before[-1] in "._/^"):
        return False  # part of a word, a version, a path or an exponent
    if re.fullmatch(r"\d{4}\.\d{4,5}", prose[start:end]):
        return False  # an arXiv id, 2003.04887 (its "arXiv" may end the line before)
    if re.match(r"\.\d|e[-+]?\d", after):
        return False  # a version (2.13.0) or scientific notation (2.5e-4)
    if re.search(r"(?:arXiv:?|Python|torch|lightning|version)\s*$", before):
        return False  # an arXiv id or a version
    return not UNIT.match(re.sub(r"^[-–]\d+(?:\.\d+)?", "", after))  # a range's unit follows its second number


# ---------------------------------------------------------------- the check


@dataclass(frozen=True)
class Problem:
    quote: Quote
    why: str

    def __str__(self) -> str:
        return f"{self.quote.doc}:{self.quote.line}: {self.quote.text}: {self.why}"


@dataclass
class Report:
    problems: list[Problem] = field(default_factory=list)
    passed: list[tuple[Quote, str]] = field(default_factory=list)  # every quote that passed, and how
    used: set[Unchecked] = field(default_factory=set)  # the UNCHECKED entries that named a quote

    @property
    def unused(self) -> list[Unchecked]:
        return [entry for entry in UNCHECKED if entry not in self.used]


def check(docs: list[Path] = DOCS) -> Report:
    report = Report()
    for doc in docs:
        if doc_name(doc) not in UNCHECKED_DOCS:
            for section in sections(doc):
                check_section(section, report)
    return report


def check_section(section: Section, report: Report) -> None:
    found = quotes(section)
    values = values_of(section.sources)
    matched: dict[Quote, list[Value]] = {}
    passed: dict[Quote, str] = {}
    for quote in found:
        entry = unchecked_entry(quote)
        if entry:
            report.used.add(entry)
            passed[quote] = f"{entry.kind}: {entry.why}"
        elif matches := [v for v in values.near(quote.number) if matches_value(quote, v)]:
            matched[quote] = matches
            passed[quote] = "in " + ", ".join(sorted({v.file.relative_to(REPO).as_posix() for v in matches})[:3])
    seeds = [seed for quote in matched if seeds_give(quote) for seed in quote.seeds]
    for quote in found:
        if quote in passed:
            continue
        if quote.std is None and any(quote.number.shows(seed) for seed in seeds):
            passed[quote] = "a seed listed beside its mean ± std in this section"
        elif is_gap(quote, list(matched)):
            passed[quote] = "the difference of two numbers verified in this section"
        else:
            what = "no (mean, std) pair" if quote.std else "no value"
            where = ", ".join(p.relative_to(REPO).as_posix() for p in section.sources) or "no results file linked"
            report.problems.append(Problem(quote, f"{what} rounds to it in {where}"))
    machines = {  # a gap's machines are its two numbers', checked as theirs
        quote: set().union(*(machines_of(v.file) for v in matches))
        for quote, matches in matched.items()
        if not is_gap(quote, list(matched))
    }
    report.problems += machine_problems(section, machines)
    report.passed += list(passed.items())


def unchecked_entry(quote: Quote) -> Unchecked | None:
    """The entry of UNCHECKED that names this quote: its doc, and the text around it on its line."""
    number = quote.text.split(" ")[0].lstrip("+-")
    for entry in UNCHECKED:
        if entry.doc in ("*", quote.doc) and number in entry.around and entry.around in quote.line_text:
            return entry
    return None


def matches_value(quote: Quote, value: Value) -> bool:
    if quote.std is None:
        return quote.number.shows(value.number)
    return value.std is not None and quote.number.shows(value.number) and quote.std.shows(value.std)


def seeds_give(quote: Quote) -> bool:
    """The seeds listed after a mean ± std reproduce it (their mean and sample std, at the printed rounding)."""
    if len(quote.seeds) < 2 or quote.std is None:
        return False
    seeds = [s.value for s in quote.seeds]
    slack = max(s.half_unit for s in quote.seeds)
    mean_ok = abs(statistics.fmean(seeds) - quote.number.value) <= quote.number.half_unit + slack + 1e-9
    std_ok = abs(statistics.stdev(seeds) - quote.std.value) <= quote.std.half_unit + 2 * slack + 1e-9
    return mean_ok and std_ok


def is_gap(quote: Quote, operands: list[Quote]) -> bool:
    """The quote is |a - b| for two other numbers verified in the section and printed alike, within their
    rounding; a gap is under 1 (nats, bits per byte), and may carry its sign (-0.011)."""
    gap = abs(quote.number.value)
    if quote.std is not None or gap >= 1:
        return False
    for i, a in enumerate(operands):
        for b in operands[i + 1 :]:
            if a.number.decimals != b.number.decimals or quote in (a, b):
                continue
            slack = a.number.half_unit + b.number.half_unit + quote.number.half_unit + 1e-9
            if abs(abs(a.number.value - b.number.value) - gap) <= slack:
                return True
    return False


def machine_problems(section: Section, machines: dict[Quote, set[str]]) -> list[Problem]:
    """Each machine a section's numbers come from is named in it; where no one machine has all of them, in each
    paragraph, list or table, where "CPU" names the section's one CPU and "GPU" the H100."""
    needed = [m for m in machines.values() if m]
    if not needed:
        return []
    section_text = section.text
    several = not set.intersection(*needed)
    cpus = {m for m in ("EPYC", "Xeon") if m in section_text}
    aliases = {"CPU": cpus if len(cpus) == 1 else set(), "GPU": {"H100"}}
    problems = []
    for quote, measured_on in machines.items():
        if not measured_on:
            continue
        text = block_text(section, quote.block) if several else section_text
        named = {m for m in MACHINES if m in text}
        named |= {m for word, ms in aliases.items() if several and re.search(rf"\b{word}s?\b", text) for m in ms}
        if not named & measured_on:
            scope = "its paragraph, list or table" if several else "its section"
            problems.append(Problem(quote, f"measured on {' or '.join(sorted(measured_on))}, not named in {scope}"))
    return problems


def block_text(section: Section, block: int) -> str:
    """One paragraph, list or table of a section; a table reads with the paragraphs right before and after it
    (its caption and notes), and those with it."""
    blocks: list[list[str]] = [[]]
    for _, line in section.lines:
        if line.strip():
            blocks[-1].append(without_code(line))
        else:
            blocks.append([])
    present = [i for i, b in enumerate(blocks) if b]
    if block not in present:
        return ""
    at = present.index(block)
    group = {block}
    for neighbour in present[max(at - 1, 0) : at + 2]:
        if is_table(blocks[block]) or is_table(blocks[neighbour]):
            group.add(neighbour)
    if at > 1 and is_table(blocks[present[at - 1]]):
        group.add(present[at - 2])  # a table's notes read with its caption too
    return " ".join(line for i in sorted(group) for line in blocks[i])


def is_table(lines: list[str]) -> bool:
    return bool(lines) and lines[0].lstrip().startswith("|")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print every number that passed, and how")
    args = parser.parse_args(argv)
    report = check()
    if args.verbose:
        for quote, how in report.passed:
            print(f"{quote.doc}:{quote.line}: {quote.text}: {how}")
    for problem in report.problems:
        print(problem)
    for entry in report.unused:
        print(f"{entry.doc}: no number quoted with {entry.around!r}: remove its entry in tests/unchecked_numbers.py")
    print(f"{len(report.passed)} numbers pass, {len(report.problems)} problems")
    return 1 if report.problems or report.unused else 0


if __name__ == "__main__":
    sys.exit(main())

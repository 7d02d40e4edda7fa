"""Every command in README.md and docs/*.md names targets, variables, subcommands and options that exist.

The commands are not run. Each ``make ...``, ``resnorm-lm ...`` and ``python -m resnorm_lm...`` line in a code
block or inline code is checked against the Makefile (targets, variables, and for ``ARGS`` the command its rule
runs) and against the parser the command really builds (captured when it parses, so the check follows the CLI
wherever its code lives). Every relative markdown link must point at a file in the repository.
"""

from __future__ import annotations

import argparse
import functools
import re
import runpy
import shlex
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import jsonargparse
import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MODULE = "resnorm_lm"  # `resnorm-lm` is `python -m resnorm_lm`
SEPARATORS = {";", "&&", "||", "|", "(", ")", "&"}


@dataclass(frozen=True)
class Command:
    where: str  # "docs/data.md:12"
    text: str

    @property
    def tokens(self) -> list[str]:
        lexer = shlex.shlex(self.text, posix=True, punctuation_chars=";&|()")  # not <>: placeholders
        lexer.whitespace_split = True
        return list(lexer)


# ---------------------------------------------------------------- finding the commands


def candidates(doc: Path) -> list[Command]:
    """Lines of code blocks (fenced or indented, ``\\`` continuations joined) and inline code spans."""
    name = doc.relative_to(REPO).as_posix() if doc.is_relative_to(REPO) else doc.name
    found: list[Command] = []
    prose: list[str] = []  # the text outside fenced blocks, for inline spans (which may wrap lines)
    fenced, pending, start = False, "", 0
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            prose.append("")
            continue
        indented = not fenced and line.startswith("    ") and not line.lstrip().startswith(("`", "- ", "* "))
        if fenced or indented or pending:
            if not pending:
                start = number
            pending += line.strip().removesuffix("\\") + " "
            if not line.rstrip().endswith("\\"):
                found.append(Command(f"{name}:{start}", pending.strip()))
                pending = ""
            prose.append("")
        else:
            prose.append(line)
    text = "\n".join(prose)
    for span in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        found.append(Command(f"{name}:{text.count(chr(10), 0, span.start()) + 1}", " ".join(span.group(1).split())))
    return found


def commands(doc: Path) -> list[tuple[Command, str, list[str]]]:
    """``(where, entry, argv)``: entry is ``make``, a module run with ``-m``, or a script path."""
    out = []
    for cand in candidates(doc):
        try:
            tokens = cand.tokens
        except ValueError:  # unbalanced quotes: prose, not a command
            continue
        segment: list[str] = []
        for token in [*tokens, ";"]:
            if token not in SEPARATORS:
                segment.append(token)
                continue
            for i, word in enumerate(segment):
                if word == "make" and i == first_word(segment):
                    out.append((cand, "make", segment[i + 1 :]))
                elif word == "resnorm-lm" and i == first_word(segment):
                    out.append((cand, MODULE, segment[i + 1 :]))
                elif word == "-m" and i + 1 < len(segment) and segment[i + 1].split(".")[0] == MODULE:
                    out.append((cand, segment[i + 1], segment[i + 2 :]))
                else:
                    continue
                break
            segment = []
        # a lone setting in prose, `--trainer.max_steps=50` or `run.checkpoint_every`: a `fit` option
        lone = re.match(r"^(?:--)?((?:model|trainer|data|run)\.[\w.+]+)(=\S*)?$", cand.text)
        if lone:
            out.append((cand, MODULE, ["fit", f"--{lone.group(1)}"]))
    return out


def first_word(segment: list[str]) -> int:
    """Index of the command word: after ``VAR=value`` environment settings and ``srun``/``for ... do``."""
    i = 0
    while i < len(segment) and (re.match(r"^[A-Z_]+=", segment[i]) or segment[i] in ("srun", "do", "then")):
        i += 1
    return i


def placeholder(value: str) -> bool:
    """A value the reader fills in (``<recipe>``, ``$ARGS``, ``auto|cpu``, ``...``), not a literal."""
    return any(c in value for c in "<>$|[]*") or "..." in value


# ---------------------------------------------------------------- the Makefile


@functools.cache
def makefile() -> tuple[dict[str, str], set[str]]:
    """``({target: its recipe text}, {user variables})`` from the Makefile."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    rules: dict[str, str] = {}
    for match in re.finditer(r"^([a-z][\w-]*):(?!=)[^\n]*\n((?:\t.*\n?)*)", text, re.M):
        rules[match.group(1)] = match.group(2)
    variables = set(re.findall(r"^([A-Z_]+) \?=", text, re.M))
    return rules, variables


def make_command(rule: str) -> tuple[str, list[str]] | None:
    """The command a rule runs with ``$(ARGS)`` appended: ``(entry, subcommands + the options the rule passes)``."""
    line = next((line for line in rule.splitlines() if "$(ARGS)" in line and "$(PY)" in line), None)
    if line is None:
        return None
    words = line.split("$(PY)", 1)[1].split()
    if words[0] == "-m":
        entry, rest = words[1], words[2:]
    else:
        entry, rest = words[0], words[1:]
    prefix = []
    for word in rest:  # subcommands: the plain words before the first option or variable
        if word.startswith(("-", "$")):
            break
        prefix.append(word)
    options = re.findall(r"(?<![\w-])--[A-Za-z][\w.+-]*", " ".join(rest))
    return entry, prefix + [f"{option}=$(VALUE)" for option in options]  # values come from make variables


def check_make(argv: list[str]) -> list[str]:
    rules, variables = makefile()
    problems, targets, settings = [], [], {}
    for token in argv:
        if "=" in token:
            key, value = token.split("=", 1)
            if key not in variables:
                problems.append(f"make variable {key} does not exist (the Makefile has {', '.join(sorted(variables))})")
            settings[key] = value
        elif not token.startswith("-") and not placeholder(token):
            targets.append(token)
    for target in targets:
        if target not in rules:
            problems.append(f"make target {target!r} does not exist")
    problems += check_names(settings.get("RECIPE"), settings.get("RECIPES"), settings.get("PROFILE"))
    args = settings.get("ARGS")
    if args and not placeholder(args.replace("*", "")):
        for target in targets:
            command = make_command(rules.get(target, ""))
            if command is None:
                problems.append(f"make {target} takes no ARGS")
            else:
                entry, base = command
                problems += check_cli(entry, base + shlex.split(args))
    return problems


def check_names(recipe: str | None, recipes: str | None, profile: str | None) -> list[str]:
    """Recipe and profile names exist (``--recipe``/``--profile`` are expanded before LightningCLI parses)."""
    from resnorm_lm.train.recipes import expand_recipe_arguments

    names = [n for n in [recipe, *(recipes or "").split()] if n and not placeholder(n)]
    profile = profile if profile and not placeholder(profile) else None
    problems = []
    for name in names or [None]:
        if name is None and profile is None:
            continue
        args = ["fit"] + (["--recipe", name] if name else []) + (["--profile", profile] if profile else [])
        try:
            expand_recipe_arguments(args)
        except ValueError as err:
            problems.append(str(err))
    return problems


# ---------------------------------------------------------------- the CLI's parsers


class Captured(Exception):
    """Raised by a patched ``parse_args`` to hand back the parser a command built."""


@functools.cache
def parser_of(entry: str, first: str | None) -> argparse.ArgumentParser:
    """The parser that ``python -m entry [first]`` (or ``python entry``) builds, caught when it parses."""

    def capture(self, *args, **kwargs):
        raise Captured(self)

    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        # runpy's note that an imported package's module (resnorm_lm.train.precision) is run again as __main__
        warnings.filterwarnings("ignore", message=".*found in sys.modules", category=RuntimeWarning)
        mp.setattr(argparse.ArgumentParser, "parse_args", capture)
        mp.setattr(jsonargparse.ArgumentParser, "parse_args", capture)
        mp.setattr(sys, "argv", [entry, *([first] if first else [])])
        try:
            if entry.endswith(".py"):
                runpy.run_path(str(REPO / entry), run_name="__main__")
            else:
                runpy.run_module(entry, run_name="__main__", alter_sys=True)
        except Captured as caught:
            return caught.args[0]
        except SystemExit as exit_:
            raise AssertionError(f"{entry} {first or ''} exited ({exit_.code}) before parsing its arguments") from None
    raise AssertionError(f"{entry} built no argument parser")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return dict(action.choices) if action else {}


def check_cli(entry: str, argv: list[str]) -> list[str]:
    """Each option of ``argv`` exists in the parser of its (sub)command; subcommands exist."""
    if entry.endswith(".py") and not (REPO / entry).is_file():
        return [f"{entry} does not exist"]
    argv = [a for a in argv if a != "..."]
    first = argv[0] if argv and not argv[0].startswith("-") and not placeholder(argv[0]) else None
    try:
        parser = parser_of(entry, first)
    except ModuleNotFoundError as err:
        return [f"python -m {entry}: {err}"]
    rest, name = argv, entry
    if first is not None and subcommands(parser):  # fit/validate/test, or `data prepare`
        choices = subcommands(parser)
        if first not in choices:
            return [f"{entry} has no subcommand {first!r} (it has {', '.join(choices)})"]
        parser, rest, name = choices[first], argv[1:], f"{entry} {first}"
    elif first is not None and entry == MODULE:  # eval/compare/generate: dispatched before their own parser
        rest, name = argv[1:], f"{entry} {first}"
    problems = []
    if entry == MODULE and isinstance(parser, jsonargparse.ArgumentParser):  # LightningCLI: expand the shorthands
        recipe, profile, kept, skip = None, None, [], False
        for i, token in enumerate(rest):
            if skip:
                skip = False
                continue
            key, _, value = token.partition("=")
            if key in ("--recipe", "--profile"):
                if not value and i + 1 < len(rest):
                    value, skip = rest[i + 1], True
                recipe, profile = (value, profile) if key == "--recipe" else (recipe, value)
            else:
                kept.append(token)
        problems += check_names(recipe, None, profile)
        rest = kept
    known = parser._option_string_actions
    for token in rest:
        if token.startswith("-") and len(token) > 1 and not re.match(r"^-\d", token):  # not a negative number
            option = token.split("=", 1)[0]
            if option not in known:
                problems.append(f"{name}: no option {option}")
    return problems


def check(entry: str, argv: list[str]) -> list[str]:
    return check_make(argv) if entry == "make" else check_cli(entry, argv)


# ---------------------------------------------------------------- links


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", text, re.M)}


def broken_links(doc: Path, root: Path = REPO) -> list[str]:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # links inside code are not links
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
        if re.match(r"^[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists() or not path.is_relative_to(root):
            problems.append(f"{doc.relative_to(root)}: link {target} points at nothing in the repository")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            problems.append(f"{doc.relative_to(root)}: link {target}: {file or doc.name} has no heading #{anchor}")
    return problems


# ---------------------------------------------------------------- the tests


def test_every_doc_command_exists():
    found = [(cmd, entry, argv) for doc in DOCS for cmd, entry, argv in commands(doc)]
    assert len(found) > 20 and {"make", MODULE} <= {e for _, e, _ in found}  # the finder finds
    problems = [f"{cmd.where}: `{cmd.text}`: {p}" for cmd, entry, argv in found for p in check(entry, argv)]
    assert problems == [], "\n".join(problems)


def test_every_relative_link_resolves():
    problems = [p for doc in DOCS for p in broken_links(doc)]
    assert problems == [], "\n".join(problems)


def test_no_page_speaks_of_issue_numbers():
    """The docs describe the project as it is; which issue changed what belongs to git history."""
    found = [
        f"{page.relative_to(REPO)}:{n}: {line.strip()}"
        for page in DOCS
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if re.search(r"\b[Ii]ssues? #?\d+|(?<![\w/&])#\d{1,3}\b", line)
    ]
    assert not found, "\n".join(found)


def test_the_checker_catches_what_does_not_exist(tmp_path):
    """A page naming a missing target, variable, recipe, subcommand, option or file fails; a correct one passes."""
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(
        "```bash\n"
        'make train RECIPE=prenorm-12l PROFILE=smoke ARGS="--trainer.max_steps=5 --model.arch.n_layer=2"\n'
        "make trian RECIPE=prenorm-12l\n"
        "make train RECIPEE=prenorm-12l\n"
        'make compare RECIPES="prenorm-12l prenorm-99l" ARGS="--no-train"\n'
        'make train ARGS="--trainer.max_stepz=5"\n'
        "```\n\n"
        "Inline: `resnorm-lm fit --recipe prenorm-12l --model.arch.n_layerz=3`, `resnorm-lm evaluate runs/x`,\n"
        "`python -m resnorm_lm.data prepare --corpuz text`, `resnorm-lm generate runs/x --top-k 5`,\n"
        "`--trainer.max_steps=50`, `--data.batch_sise=32`, `run.checkpoint_every`, `model.divergence.factr`.\n\n"
        "    OMP_WAIT_POLICY=PASSIVE python -m resnorm_lm fit --recipe prenorm-12l \\\n"
        "        --run.bogus=1; done\n"
    )
    problems = [p for _, entry, argv in commands(page) for p in check(entry, argv)]
    expected = [
        "make target 'trian'",
        "make variable RECIPEE",
        "unknown recipe 'prenorm-99l'",
        "no option --trainer.max_stepz",
        "no option --model.arch.n_layerz",
        "no subcommand 'evaluate'",
        "no option --corpuz",
        "no option --top-k",
        "no option --run.bogus",
        "no option --data.batch_sise",
        "no option --model.divergence.factr",
    ]
    for text in expected:
        assert sum(text in p for p in problems) == 1, (text, problems)
    assert len(problems) == len(expected), problems  # the first, correct command raised nothing
    links = tmp_path / "links.md"
    links.write_text(
        "# Top & tail\n[fine](docs/page.md) [gone](docs/nowhere.md#x) [anchor](#top--tail) [web](https://example.org)\n"
        "[no heading](#bottom) [no heading there](links.md#top)\n"
    )
    assert broken_links(links, root=tmp_path) == [
        "links.md: link docs/nowhere.md#x points at nothing in the repository",
        "links.md: link #bottom: links.md has no heading #bottom",
        "links.md: link links.md#top: links.md has no heading #top",
    ]

"""The numbers in the results files under docs/results/, each with its printed rounding and its machine.

What ``tests/doc_numbers.py`` looks a quoted number up in: a ``.md`` table's printed numbers (``a ± b`` as one
pair), a ``.csv``'s cells (``X_mean`` with ``X_std`` or ``X_half_width`` as one pair), an ``eval.json``'s numbers,
the mean ± std over the seeds of each setting of a ``run-files`` folder (as ``compare`` computes it), and a
``layer_contribution.csv``'s per-run quarter means and half sums. Imports nothing from the package.
"""

from __future__ import annotations

import bisect
import csv
import functools
import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
MACHINES = ("H100", "EPYC", "Xeon")  # as a `Hardware:` line or a manifest names them, and as the docs do
MACHINE_FREE = (RESULTS / "at-init",)  # one forward and backward pass at init: no training, no machine to name
RUN_TAG = re.compile(r"^(?P<setting>.+)-seed\d+$")  # cpu-lr0.001-wu200-seed2, cpu-d24-lr0.004-wu200-seed1, cpu-seed1


@dataclass(frozen=True)
class Number:
    """A number as printed: its value and the decimals it was printed with (None: a file's full precision)."""

    value: float
    decimals: int | None

    @classmethod
    def parse(cls, text: str) -> Number:
        text = text.replace("−", "-")
        return cls(float(text), len(text.split(".")[1]) if "." in text else 0)

    @property
    def half_unit(self) -> float:
        return 0.0 if self.decimals is None else 0.5 * 10.0**-self.decimals

    def shows(self, source: Number) -> bool:
        """True when this printed number is `source` rounded to this number's decimals."""
        if source.decimals is not None and self.decimals is not None and source.decimals < self.decimals:
            return False  # more digits than the source has
        if self.value >= 0 > source.value + source.half_unit + 1e-12:
            return False  # an unsigned quote of a negative value
        return abs(source.value - self.value) <= self.half_unit + source.half_unit + 1e-9


@dataclass(frozen=True)
class Value:
    """A number in a results file, with the std it was printed beside (a mean ± std), and the file."""

    number: Number
    std: Number | None
    file: Path


class Values:
    """The values of a set of results files, sorted, to find those a printed number may round from."""

    WIDEST = 0.05  # the largest half unit of a printed source value (one decimal)

    def __init__(self, values: list[Value]):
        self.values = sorted(values, key=lambda v: v.number.value)
        self.keys = [v.number.value for v in self.values]

    def near(self, number: Number) -> list[Value]:
        reach = number.half_unit + self.WIDEST + 1e-9
        lo, hi = (
            bisect.bisect_left(self.keys, number.value - reach),
            bisect.bisect_right(self.keys, number.value + reach),
        )
        return self.values[lo:hi]


@functools.cache
def values_of(sources: tuple[Path, ...]) -> Values:
    """Every value the linked files and folders hold (see the module's docstring)."""
    out: list[Value] = []
    for source in sources:
        for file in data_files(source):
            out += values_in(file)
        if source.is_dir():
            for folder in [source, *source.rglob("run-files*")]:
                if folder.name.startswith("run-files"):
                    out += seed_groups(folder)
    return Values(out)


def data_files(path: Path) -> list[Path]:
    """The files a link names: the file itself, or every table under a folder (a metrics.csv only by its own
    name); a figure names the tables of its folder."""
    if path.suffix == ".png":
        return data_files(path.parent)
    if path.is_file():
        return [path] if path.suffix in (".csv", ".md", ".json") and path.name != "manifest.json" else []
    files = [p for p in sorted(path.rglob("*")) if p.suffix in (".csv", ".md", ".json")]
    return [p for p in files if p.name not in ("metrics.csv", "manifest.json")]


@functools.cache
def values_in(file: Path) -> tuple[Value, ...]:
    text = file.read_text()
    out: list[Value] = []
    if file.suffix == ".md":
        for match in re.finditer(r"([+\-−]?\d+\.\d+)(?:\s*±\s*(\d+\.\d+))?", text):
            std = Number.parse(match.group(2)) if match.group(2) else None
            out.append(Value(Number.parse(match.group(1)), std, file))
            if std:
                out.append(Value(std, None, file))
    elif file.suffix == ".csv":
        for row in csv.DictReader(text.splitlines()):
            for column, cell in row.items():
                number = as_float(cell)
                if number is None:
                    continue
                std = spread_of(row, column)
                out.append(Value(Number(number, None), None if std is None else Number(std, None), file))
    elif file.suffix == ".json":
        out += [Value(Number(v, None), None, file) for v in json_numbers(json.loads(text))]
    if file.name == "layer_contribution.csv":
        out += [Value(Number(v, None), None, file) for v in run_aggregates(text)]
    return tuple(out)


def spread_of(row: dict[str, str], column: str) -> float | None:
    """The ± of an ``X_mean`` cell: its row's ``X_std``, or ``X_half_width`` (a suite's paired 95% interval,
    ``pairs.csv``); None for any other column."""
    if not column.endswith("_mean"):
        return None
    stem = column.removesuffix("_mean")
    return as_float(row.get(f"{stem}_std") or row.get(f"{stem}_half_width"))


def run_aggregates(text: str) -> list[float]:
    """Per run of a layer_contribution.csv: the loss increase averaged over its first and last quarter of blocks
    (ceil(L/4) each, what layer_contribution.md averages over the seeds) and summed over each half of the stack."""
    runs: dict[tuple[str, ...], list[float]] = {}
    for row in csv.DictReader(text.splitlines()):
        runs.setdefault((row["recipe"], row["n_layer"], row["seed"]), []).append(float(row["loss_increase"]))
    out = []
    for increases in runs.values():  # (n_layer,), block 0 first
        quarter, half = math.ceil(len(increases) / 4), len(increases) // 2
        out += [statistics.fmean(increases[:quarter]), statistics.fmean(increases[-quarter:])]
        out += [sum(increases[:half]), sum(increases[half:])]
    return out


@functools.cache
def seed_groups(folder: Path) -> tuple[Value, ...]:
    """Mean ± std over the seeds of each setting of a run-files folder: the val and test loss, ppl and bpb."""
    groups: dict[tuple[Path, str], list[Path]] = {}
    for eval_json in sorted(folder.rglob("eval.json")):
        tag = RUN_TAG.match(eval_json.parent.name)
        if tag:
            groups.setdefault((eval_json.parent.parent, tag["setting"]), []).append(eval_json)
    out = []
    for files in groups.values():
        if len(files) < 2:
            continue
        runs = [json.loads(f.read_text()) for f in files]
        columns = [[r[key] for r in runs] for key in ("val_loss", "val_ppl", "val_bpb")]
        for split in ("validation", "test"):
            if all(split in r.get("eval", {}) for r in runs):
                columns += [[r["eval"][split][key] for r in runs] for key in ("loss", "ppl", "bpb")]
        for column in columns:  # files[0]: where its machine is read
            out.append(Value(Number(statistics.fmean(column), None), Number(statistics.stdev(column), None), files[0]))
    return tuple(out)


@functools.cache
def machines_of(file: Path) -> frozenset[str]:
    """The machines a results file was measured on: the ``manifest.json`` beside it, else the ``Hardware:`` lines
    of the ``compare*.md`` in its folder or the nearest folder above that has one. None for at-init numbers."""
    if any(file.is_relative_to(free) for free in MACHINE_FREE):
        return frozenset()
    manifest = file.parent / "manifest.json"
    if manifest.exists():
        return named_in(json.dumps(json.loads(manifest.read_text()).get("hardware", {})))
    for folder in [file.parent, *file.parent.parents]:
        lines = [line for md in folder.glob("compare*.md") for line in re.findall(r"Hardware: .*", md.read_text())]
        if lines or folder == RESULTS:
            return named_in(" ".join(lines))
    return frozenset()


def named_in(text: str) -> frozenset[str]:
    return frozenset(m for m in MACHINES if m in text)


def as_float(cell: str | None) -> float | None:
    try:
        number = float(cell)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def json_numbers(node: object) -> list[float]:
    if isinstance(node, dict):
        return [v for child in node.values() for v in json_numbers(child)]
    if isinstance(node, list):
        return [v for child in node for v in json_numbers(child)]
    return [float(node)] if isinstance(node, (int, float)) and not isinstance(node, bool) else []

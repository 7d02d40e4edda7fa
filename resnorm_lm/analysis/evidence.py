"""What a table may claim: the intervals of its numbers (small samples of paired seeds) and whether its rows share
one arithmetic (their provenance).

## Intervals

Intervals for small samples of runs: a mean's, a paired difference's, a failure rate's, and the groups of rows
that the intervals do not separate.

With n seeds, the 95% interval of a mean is ``mean ± t(0.975, n-1) * s / sqrt(n)`` (Student's t: 2.78 s/sqrt(n) at
n = 5, not the normal 1.96). Two recipes trained on the same seeds (the same init draw and data order for seed k)
pair by seed: the interval of their mean difference uses the spread of the differences, which is usually far
smaller than either recipe's own. A failure rate (k stuck or diverged of n) gets Wilson's score interval, which
stays inside [0, 1] and is sound at k = 0 or k = n.

And the two helpers every table of results uses: grouping rows by some of their values, and a mean printed with
its spread.

Student's t quantile is computed here (the regularized incomplete beta function by its continued fraction, then
bisection) rather than taken from scipy, which the GPU image the suites also run on does not have.

## Provenance

Where a table's rows come from, and whether they may share a table.

Rows belong in one table only when their runs computed the same arithmetic. Each run's manifest records it
(``resnorm_lm/train/arithmetic.py``): what set it (device, precision, torch, kernel caps, threads) and its
fingerprint. Runs whose ``reference`` fingerprints differ, or runs of one recipe whose ``model`` fingerprints
differ (the code changed that recipe's numbers between them), are refused in one table unless asked for
(``--mix-provenance``), and then each row is marked with the provenance it comes from. A run from before
fingerprints were recorded is known by its machine, precision and torch instead: two such runs compare equal only
when all three do.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resnorm_lm.errors import ResnormError
from resnorm_lm.train.runs import RunDir

CONFIDENCE = 0.95


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (modified Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below this point: use the symmetry there
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * fraction / a


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on ``t_cdf``)."""
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` values with the half-width of its two-sided ``CONFIDENCE`` interval (None for n < 2)."""

    mean: float
    half_width: float | None
    n: int

    @property
    def low(self) -> float | None:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.half_width is None else self.mean + self.half_width

    def excludes_zero(self) -> bool:
        return self.half_width is not None and (self.low > 0 or self.high < 0)

    def text(self, digits: int = 3) -> str:
        """'5.012 ± 0.008' (n >= 2), or the one value."""
        if self.half_width is None:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"


def spread(values: list[float]) -> str:
    """'13.2 (4.8..235)': the median and the range, for values that span orders of magnitude (gains, ratios)."""
    if not values:
        return "-"
    return f"{statistics.median(values):.3g} ({min(values):.3g}..{max(values):.3g})"


def interval_text(interval: Interval | None, digits: int = 3, sign: bool = False) -> str:
    """An interval as a table prints it ('-' for none; '+0.132 ± 0.032' with ``sign`` for a difference)."""
    if interval is None:
        return "-"
    text = interval.text(digits)
    return ("+" + text) if sign and interval.mean >= 0 else text


def mean_interval(values: Sequence[float]) -> Interval | None:
    """The mean of ``values`` and its t interval; None for no values."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    n = len(values)
    if n < 2:
        return Interval(values[0], None, 1)
    t = t_quantile(0.5 + CONFIDENCE / 2, n - 1)
    return Interval(statistics.fmean(values), t * statistics.stdev(values) / math.sqrt(n), n)


def paired_difference(a: dict[int, float], b: dict[int, float]) -> Interval | None:
    """``a - b`` over the seeds both have (each a {seed: value}), as a mean with its t interval; None when they
    share no seed."""
    common = sorted(set(a) & set(b))
    return mean_interval([a[k] - b[k] for k in common]) if common else None


@dataclass(frozen=True)
class Proportion:
    """k of n, with Wilson's score interval."""

    k: int
    n: int

    def interval(self) -> tuple[float, float]:
        if self.n == 0:
            return 0.0, 1.0
        z = statistics.NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)
        p = self.k / self.n
        centre = (p + z * z / (2 * self.n)) / (1 + z * z / self.n)
        half = z * math.sqrt(p * (1 - p) / self.n + z * z / (4 * self.n * self.n)) / (1 + z * z / self.n)
        return max(0.0, centre - half), min(1.0, centre + half)

    def text(self) -> str:
        """'1/5 (4-62%)'."""
        low, high = self.interval()
        return f"{self.k}/{self.n} ({100 * low:.0f}-{100 * high:.0f}%)"


def groups(names: Sequence[str], separated: Callable[[str, str], bool]) -> dict[str, str]:
    """Letters for rows ranked best first: two rows share a letter exactly when their intervals do not separate them.

    Each letter is a largest set of rows no two of which ``separated`` says apart (a maximal clique of the
    "not separated" graph), lettered in the order of their best rows; a row gets the letter of every set it is in
    (the compact letter display of Piepho 2004): 'a' for the leaders and those tied with them, 'ab' for a row tied
    with both groups. A row need not sit next to the rows it ties with: a row with a wide interval (two seeds that
    learned of five) can tie with the leader while a row ranked between them is separated from it, and then it
    carries the leader's letter too."""
    n = len(names)
    tied = [{j for j in range(n) if j != i and not separated(names[i], names[j])} for i in range(n)]
    cliques: list[tuple[int, ...]] = []

    def extend(clique: set[int], candidates: set[int], excluded: set[int]) -> None:  # Bron-Kerbosch with a pivot
        if not candidates and not excluded:
            cliques.append(tuple(sorted(clique)))
            return
        pivot = max(candidates | excluded, key=lambda u: len(tied[u] & candidates))
        for v in sorted(candidates - tied[pivot]):
            extend(clique | {v}, candidates & tied[v], excluded & tied[v])
            candidates = candidates - {v}
            excluded = excluded | {v}

    extend(set(), set(range(n)), set())
    letters = {name: "" for name in names}
    for index, clique in enumerate(sorted(cliques)):
        for i in clique:
            letters[names[i]] += _letter(index)
    return letters


def _letter(index: int) -> str:
    return "abcdefghijklmnopqrstuvwxyz"[index] if index < 26 else f"[{index}]"


def group_rows(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    """``rows`` grouped by the values of ``keys``, in order of first appearance."""
    out: dict[tuple, list[dict]] = {}
    for row in rows:
        out.setdefault(tuple(row[k] for k in keys), []).append(row)
    return out


def num(mean: float | None, std: float | None, digits: int = 3) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std else "")


class ProvenanceError(ResnormError, ValueError):
    """Runs whose arithmetic may differ, asked to share a table."""


@dataclass(frozen=True)
class Provenance:
    """What one run's numbers were computed with (its latest segment's record)."""

    arithmetic: str  # the reference fingerprint, or "machine / precision / torch" for a run without one
    model: str | None  # the model fingerprint (None: not recorded)
    machine: str
    precision: str
    torch: str
    code: str
    portable: bool | None
    device: str | None = None  # "cpu", or the GPU it computed on (None: not recorded)
    tf32: bool | None = None  # whether fp32 matrix products ran in TF32 on that GPU

    @classmethod
    def of(cls, run_dir: Path) -> Provenance:
        manifest = RunDir(run_dir).manifest()
        segments = manifest.get("segments") or [manifest]
        last = segments[-1]
        record = last.get("arithmetic") or {}
        hardware = last.get("hardware") or {}
        machine = ", ".join(hardware.get("gpus") or []) or hardware.get("cpu") or "unknown machine"
        precision = str(record.get("precision") or last.get("precision") or "unknown precision")
        torch = record.get("torch") or (last.get("packages") or {}).get("torch") or "unknown torch"
        fingerprint = record.get("fingerprint") or {}
        version = fingerprint.get("version")
        reference = f"{fingerprint['reference']} (v{version})" if fingerprint.get("reference") else None
        return cls(
            arithmetic=reference or f"{machine} / {precision} / torch {torch}",
            model=f"{fingerprint['model']} (v{version})" if fingerprint.get("model") else None,
            machine=machine,
            precision=precision,
            torch=torch,
            code=str(last.get("code_revision") or "unknown"),
            portable=record.get("portable"),
            device=record.get("device"),
            tf32=record.get("tf32"),
        )

    @property
    def short_code(self) -> str:
        """The code revision as a table prints it: the commit's first 12 characters, keeping '+dirty' (a run
        trained from uncommitted changes to the code says so)."""
        return self.code[:12] + ("+dirty" if self.code.endswith("+dirty") else "")

    @property
    def kernels(self) -> str:
        """The kernels' arithmetic in words: a GPU's (TF32 on or off), or the CPU's capped or native kernels."""
        if self.device not in (None, "cpu"):
            return "CUDA, TF32 " + {True: "on", False: "off"}.get(self.tf32, "not recorded")
        return {True: "portable (AVX2 caps, one thread)", False: "native"}.get(self.portable, "not recorded")


def segment_arithmetics(run_dir: Path) -> set[str]:
    """The reference fingerprints of every segment of a run (a run resumed elsewhere has several)."""
    manifest = RunDir(run_dir).manifest()
    found = set()
    for segment in manifest.get("segments") or [manifest]:
        reference = ((segment.get("arithmetic") or {}).get("fingerprint") or {}).get("reference")
        found.add(reference or "not recorded")
    return found


@dataclass
class TableProvenance:
    """The provenances of a table's runs, by recipe; ``check`` refuses a mixed table."""

    runs: dict[str, list[Path]]  # recipe -> its run directories in the table

    def __post_init__(self) -> None:
        self.of = {d: Provenance.of(d) for dirs in self.runs.values() for d in dirs}
        arithmetics = sorted({p.arithmetic for p in self.of.values()})
        self.labels = {a: chr(ord("A") + i) if i < 26 else f"A{i}" for i, a in enumerate(arithmetics)}

    def problems(self) -> list[str]:
        """Why the runs may not share one table (empty: they may)."""
        out = []
        if len(self.labels) > 1:
            counts = {a: sum(p.arithmetic == a for p in self.of.values()) for a in self.labels}
            out.append(
                "the runs computed with different arithmetic: "
                + "; ".join(f"{self.labels[a]}: {a} ({counts[a]} runs, on {self._machines(a)})" for a in self.labels)
            )
        for recipe, dirs in self.runs.items():
            models = {self.of[d].model for d in dirs if self.of[d].model}
            if len(models) > 1:
                codes = sorted({self.of[d].short_code for d in dirs})
                out.append(
                    f"{recipe}'s runs have {len(models)} model fingerprints: the code changed its numbers "
                    f"between them (code revisions {', '.join(codes)})"
                )
        for dirs in self.runs.values():
            for d in dirs:
                if len(segment_arithmetics(d)) > 1:
                    out.append(f"{d} was resumed with other arithmetic than it started with")
        return out

    def check(self, allow_mixed: bool) -> None:
        problems = self.problems()
        if problems and not allow_mixed:
            raise ProvenanceError(
                "refusing to put these runs in one table:\n  " + "\n  ".join(problems) + "\nA table's rows must "
                "share one arithmetic (docs/comparing.md, provenance). Keep one table per provenance (--root), or "
                "pass --mix-provenance to render it anyway with each row marked by its provenance."
            )

    def row_mark(self, recipe: str) -> str:
        """The provenance labels of a recipe's runs ('A', or 'A, B' in a mixed table)."""
        return ", ".join(sorted({self.labels[self.of[d].arithmetic] for d in self.runs.get(recipe, [])}))

    def _machines(self, arithmetic: str) -> str:
        return ", ".join(sorted({p.machine for p in self.of.values() if p.arithmetic == arithmetic}))

    def lines(self) -> list[str]:
        """The table's provenance, for its header: one line per arithmetic, each with what set it."""
        out = []
        for arithmetic, label in self.labels.items():
            members = [p for p in self.of.values() if p.arithmetic == arithmetic]
            facts: dict[str, Any] = {
                "machines": self._machines(arithmetic),
                "precision": ", ".join(sorted({p.precision for p in members})),
                "torch": ", ".join(sorted({p.torch for p in members})),
                "code": ", ".join(sorted({p.short_code for p in members})),
            }
            kernels = ", ".join(sorted({p.kernels for p in members}))
            mark = f"{label}: " if len(self.labels) > 1 else ""
            out.append(
                f"{mark}arithmetic {arithmetic}: {len(members)} runs on {facts['machines']}; precision "
                f"{facts['precision']}; torch {facts['torch']}; kernels {kernels}; training code "
                f"{facts['code']}"
            )
        return out


def table_provenance(runs: Iterable[tuple[str, Path]]) -> TableProvenance:
    """(recipe, run directory) pairs as a ``TableProvenance``."""
    by_recipe: dict[str, list[Path]] = {}
    for recipe, run_dir in runs:
        by_recipe.setdefault(recipe, []).append(Path(run_dir))
    return TableProvenance(by_recipe)


def interval_columns(row: dict[str, Any]) -> dict[str, Any]:
    """A row for the CSV: every interval as its mean, half-width and n; a proportion as k and n."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, Interval):
            out.update({f"{key}_mean": value.mean, f"{key}_half_width": value.half_width, f"{key}_n": value.n})
        elif isinstance(value, Proportion):
            low, high = value.interval()
            out.update({f"{key}_k": value.k, f"{key}_n": value.n, f"{key}_low": low, f"{key}_high": high})
        else:
            out[key] = value
    return out

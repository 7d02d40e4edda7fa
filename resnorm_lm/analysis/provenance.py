"""Where a table's rows come from, and whether they may share a table.

Rows belong in one table only when their runs computed the same arithmetic. Each run's manifest records it
(``resnorm_lm/train/arithmetic.py``): what set it (device, precision, torch, kernel caps, threads) and its
fingerprint. Runs whose ``reference`` fingerprints differ, or runs of one recipe whose ``model`` fingerprints
differ (the code changed that recipe's numbers between them), are refused in one table unless asked for
(``--mix-provenance``), and then each row is marked with the provenance it comes from. A run from before
fingerprints were recorded is known by its machine, precision and torch instead: two such runs compare equal only
when all three do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resnorm_lm.errors import ResnormError
from resnorm_lm.train.runs import RunDir


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
        )


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
                codes = sorted({self.of[d].code[:12] for d in dirs})
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
                "code": ", ".join(sorted({p.code[:12] for p in members})),
            }
            portable = {p.portable for p in members}
            kernels = (
                "portable (AVX2 caps, one thread)"
                if portable == {True}
                else ("native" if portable == {False} else "not recorded")
            )
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

"""What comes back from the offline GPU machine's output folder ($OUT), and a layout of stage files that fits it.

The device tool copies back at most 8 files, 16 MiB each and 64 MiB together, no more than two folders down
($OUT/a/b/file comes back, $OUT/a/b/c/file does not), every file and folder named in letters, digits, '.', '_'
and '-' alone, plain files only (no links). Anything else is left out, silently as far as the command can tell.

    python benchmarks/device_files.py check gpu-out     # prints what would not come back; exit 1 if anything

``layout_problems`` is that check; ``publish`` lays stage files out as ``$OUT/<stage>/<name>`` and, where
more files were written than may come back, packs the least important of each stage into
``<stage>/<stage>-files.tar.gz``. Standard library only: it runs on the GPU machine's bare Python.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20
MAX_TOTAL_BYTES = 64 * 2**20
MAX_FOLDERS_DOWN = 2  # $OUT/a/b/file
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def layout_problems(out: Path) -> list[str]:
    """Every reason something under ``out`` would not come back (empty: all of it does)."""
    out = Path(out)
    problems, files, total = [], [], 0
    for folder, dirs, names in os.walk(out):  # links are not followed: each is reported below
        here = Path(folder)
        for name in sorted(dirs + names):
            path = here / name
            rel = path.relative_to(out)
            if not NAME.match(name):
                problems.append(f"{rel}: a name with characters other than letters, digits, '.', '_' and '-'")
            if path.is_symlink():
                problems.append(f"{rel}: a link, not a plain file")
            elif path.is_file():
                files.append(rel)
                size = path.stat().st_size
                total += size
                if len(rel.parts) - 1 > MAX_FOLDERS_DOWN:
                    problems.append(f"{rel}: {len(rel.parts) - 1} folders down (at most {MAX_FOLDERS_DOWN})")
                if size > MAX_FILE_BYTES:
                    problems.append(f"{rel}: {size / 2**20:.1f} MiB (at most {MAX_FILE_BYTES // 2**20} MiB a file)")
            elif not path.is_dir():
                problems.append(f"{rel}: not a plain file")
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files (at most {MAX_FILES}): {', '.join(map(str, sorted(files)))}")
    if total > MAX_TOTAL_BYTES:
        problems.append(f"{total / 2**20:.1f} MiB in all (at most {MAX_TOTAL_BYTES // 2**20} MiB)")
    return problems


@dataclass
class StageFiles:
    """A stage's files to publish, most important first: (name under $OUT/<stage>/, where it is now)."""

    stage: str
    files: list[tuple[str, Path]] = field(default_factory=list)


@dataclass
class Placement:
    """Where each stage's files go: kept flat, packed into the stage's tarball, or left out (with why)."""

    flat: dict[str, list[tuple[str, Path]]]
    packed: dict[str, list[tuple[str, Path]]]
    left_out: list[str]


def tarball_name(stage: str) -> str:
    return f"{stage}-files.tar.gz"


def place(stages: list[StageFiles], max_files: int = MAX_FILES) -> Placement:
    """Keep every file flat while they fit ``max_files``; else move files into their stage's tarball, one at a
    time, always from the stage using the most slots (the later on a tie) and its least important file first."""
    if len(stages) > max_files:
        raise ValueError(f"{len(stages)} stages in one command: at most {max_files} can come back")
    flat, left_out = {}, []
    for s in stages:
        flat[s.stage] = []
        for name, path in s.files:
            if not NAME.match(name):
                raise ValueError(f"{s.stage}/{name}: not a name that comes back")
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                left_out.append(f"{s.stage}/{name} ({size / 2**20:.1f} MiB: over {MAX_FILE_BYTES // 2**20} MiB)")
            else:
                flat[s.stage].append((name, path))
    packed: dict[str, list[tuple[str, Path]]] = {s.stage: [] for s in stages}

    def slots(stage: str) -> int:
        return len(flat[stage]) + (1 if packed[stage] else 0)

    while sum(map(slots, flat)) > max_files:
        stage = max(reversed(list(flat)), key=lambda name: (slots(name), bool(flat[name])))
        packed[stage].insert(0, flat[stage].pop())  # the tarball keeps the stage's order
    return Placement(flat, {k: v for k, v in packed.items() if v}, left_out)


def publish(stages: list[StageFiles], out: Path, max_files: int = MAX_FILES) -> list[str]:
    """Write ``stages`` under ``out`` (each ``out/<stage>/`` replaced) in at most ``max_files`` files and within
    the size limits; returns notes on what was packed or left out. Files too large for the total are left out,
    largest first."""
    out = Path(out)
    placement = place(stages, max_files)
    notes = [f"left out: {what}" for what in placement.left_out]
    for s in stages:
        shutil.rmtree(out / s.stage, ignore_errors=True)
        (out / s.stage).mkdir(parents=True)
        for name, path in placement.flat[s.stage]:
            shutil.copyfile(path, out / s.stage / name)
        if s.stage in placement.packed:
            members = placement.packed[s.stage]
            with tarfile.open(out / s.stage / tarball_name(s.stage), "w:gz") as tar:
                for name, path in members:
                    tar.add(path, arcname=name)
            notes.append(
                f"{s.stage}: {', '.join(n for n, _ in members)} packed into {tarball_name(s.stage)} "
                f"(more files than the {MAX_FILES} that come back)"
            )
    written = sorted((p for s in stages for p in (out / s.stage).iterdir()), key=lambda p: p.stat().st_size)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    while total > MAX_TOTAL_BYTES and written:
        largest = written.pop()
        total -= largest.stat().st_size
        notes.append(
            f"left out: {largest.relative_to(out)} ({largest.stat().st_size / 2**20:.1f} MiB: the "
            f"files together are over {MAX_TOTAL_BYTES // 2**20} MiB)"
        )
        largest.unlink()
    for s in stages:
        if (out / s.stage / tarball_name(s.stage)).is_file():
            size = (out / s.stage / tarball_name(s.stage)).stat().st_size
            if size > MAX_FILE_BYTES:
                notes.append(f"{s.stage}/{tarball_name(s.stage)} is {size / 2**20:.1f} MiB: it will not come back")
    return notes


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "check":
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    problems = layout_problems(Path(argv[1]))
    for problem in problems:
        print(f"{argv[1]}: {problem}")
    print(f"{argv[1]}: {'does not fit' if problems else 'fits'} what comes back from the device")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

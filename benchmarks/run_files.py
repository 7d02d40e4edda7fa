"""The small files of finished runs, carried to the GPU machine and brought back, never a checkpoint.

A depth sweep's runs (``compare --root``) outlive a device command only through these tarballs: the GPU machine
goes back after 30 s idle and its disk with it, and a checkpoint is far too large to come back. So:

- ``seed_runs`` (on the networked machine, ``gpu_session.sh prepare``): the finished runs committed under
  ``docs/results/*/run-files*/`` that trained at the depth sweep's profile and precision, as one tarball to carry;
- ``unpack_runs``: each carried tarball into the sweep's root on the GPU machine, never over a run already there
  (a warm machine keeps its root, checkpoints and all, between commands);
- ``pack_runs``: every finished run under the root, its files but no checkpoint, in parts that each come back;
- ``measure_contributions``: the layer contribution of finished runs that still have their checkpoint and no
  cached measurement, best validation loss first, while time lasts (``compare`` measures only the picks,
  and a later round may pick a run whose checkpoint went with an earlier machine).

A run is finished when its eval.json says so (``"finished": true``), as ``compare`` counts it: every run file is
read through ``RunDir``, the package's one reader of run directories.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tarfile
import time
from pathlib import Path

from resnorm_lm.train.runs import RunDir

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_PARTS = {"checkpoints"}  # never carried, never brought back
PART_BYTES = 32 * 2**20  # uncompressed bytes per tarball part: text compresses 3-6x, so each part stays far
# under the 16 MiB that comes back


def eval_summary(run_dir: Path) -> dict:
    """The run's eval.json ({} when absent, or half written by a run that was killed)."""
    try:
        return RunDir(run_dir).summary()
    except ValueError:
        return {}


def finished_runs(root: Path) -> list[Path]:
    """Run directories under ``root`` (``<recipe>/<tag>``) whose eval.json says finished, sorted."""
    return sorted(p.parent for p in Path(root).glob("*/*/eval.json") if eval_summary(p.parent).get("finished"))


def small_files(run_dir: Path) -> list[Path]:
    """A run's files without its checkpoints (and without a checkpoint write's leftover temp files)."""
    return sorted(
        p
        for p in run_dir.rglob("*")
        if p.is_file()
        and not SKIPPED_PARTS & set(p.relative_to(run_dir).parts)
        and not p.name.endswith(".ckpt")
        and ".tmp-" not in p.name
    )


def trained_precision(run_dir: Path) -> str | None:
    """The precision a run trained at: eval.json's record, else its config.yaml's ``trainer.precision``."""
    recorded = (eval_summary(run_dir).get("eval") or {}).get("trained_precision")
    if recorded:
        return recorded
    precision = (RunDir(run_dir).config().get("trainer") or {}).get("precision")
    return None if precision is None else str(precision)


def seed_runs(sources: list[Path], profile: str, precision: str) -> tuple[dict[str, Path], list[str]]:
    """``{"<recipe>/<tag>": run dir}`` of the finished runs under ``sources`` (run-files folders) trained with
    ``profile`` at ``precision``; the first source wins where two hold the same run. Also the notes on what was
    passed over (another precision, a duplicate)."""
    chosen: dict[str, Path] = {}
    notes = []
    for source in sources:
        for run_dir in finished_runs(source):
            key = f"{run_dir.parent.name}/{run_dir.name}"
            if not run_dir.name.startswith(f"{profile}-"):
                continue
            found = trained_precision(run_dir)
            if found != precision:
                notes.append(f"{run_dir}: trained at {found}, not {precision}: not carried")
            elif key in chosen:
                notes.append(f"{run_dir}: the same run as {chosen[key]}, which is carried")
            else:
                chosen[key] = run_dir
    return chosen, notes


def write_tarball(path: Path, runs: dict[str, Path]) -> None:
    """``runs`` (``{"<recipe>/<tag>": run dir}``) as one gzipped tarball of their small files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for key, run_dir in sorted(runs.items()):
            for f in small_files(run_dir):
                tar.add(f, arcname=f"{key}/{f.relative_to(run_dir).as_posix()}")


def pack_runs(root: Path, dest: Path, stem: str, part_bytes: int = PART_BYTES) -> list[Path]:
    """Every finished run under ``root`` into ``dest/<stem>-1.tar.gz``, ``-2``, ...: a new part once the runs in
    the current one reach ``part_bytes`` uncompressed. Returns the parts (none without finished runs)."""
    parts: list[dict[str, Path]] = [{}]
    size = 0
    for run_dir in finished_runs(root):
        run_bytes = sum(f.stat().st_size for f in small_files(run_dir))
        if parts[-1] and size + run_bytes > part_bytes:
            parts.append({})
            size = 0
        parts[-1][f"{run_dir.parent.name}/{run_dir.name}"] = run_dir
        size += run_bytes
    out = []
    for i, runs in enumerate(p for p in parts if p):
        out.append(dest / f"{stem}-{i + 1}.tar.gz")
        write_tarball(out[-1], runs)
    return out


def unpack_runs(tarballs: list[Path], root: Path) -> tuple[int, int]:
    """Each tarball's runs into ``root``, skipping a run directory that already exists there (a warm machine's
    run, perhaps with its checkpoints). Returns (runs unpacked, runs already there)."""
    added, kept = set(), set()
    for tarball in tarballs:
        with tarfile.open(tarball, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
            for member in members:
                key = "/".join(Path(member.name).parts[:2])
                if key in kept or ((root / key).exists() and key not in added):
                    kept.add(key)
                    continue
                added.add(key)
                target = root / member.name
                if not target.resolve().is_relative_to(root.resolve()):
                    raise ValueError(f"{tarball}: {member.name} points outside {root}")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    return len(added), len(kept)


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a text file."""
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


ERROR_MARKS = ("Traceback (most recent call last)", "resnorm-lm: error:")  # what a run that failed logs


def unfinished_without_checkpoint(root: Path) -> list[Path]:
    """Run directories with a log but neither a finished eval.json nor a checkpoint."""
    return sorted(
        p.parent
        for p in Path(root).glob("*/*/train.log")
        if not eval_summary(p.parent).get("finished") and not RunDir(p.parent).last_checkpoint.is_file()
    )


def ended_in_error(run_dir: Path) -> bool:
    """Whether the run's train.log holds a traceback or resnorm-lm's error line (a run stopped before its first
    checkpoint, by a budget's SIGTERM or a kill, holds neither)."""
    text = (Path(run_dir) / "train.log").read_text(errors="replace")
    return any(mark in text for mark in ERROR_MARKS)


def failed_runs(root: Path) -> list[Path]:
    """Runs that ended in an error: no finished eval.json, no checkpoint, and an error in their log."""
    return [r for r in unfinished_without_checkpoint(root) if ended_in_error(r)]


def stopped_runs(root: Path) -> list[Path]:
    """Runs stopped before their first checkpoint with no error in their log: they start again from step 0."""
    return [r for r in unfinished_without_checkpoint(root) if not ended_in_error(r)]


# ---------------------------------------------------------------- the layer contribution (a child process)


def contribution_order(root: Path, n_tokens: int) -> list[Path]:
    """Finished runs with a checkpoint and no measurement of ``n_tokens`` tokens at their last step: the best
    validation loss of each (recipe, depth) first, then the second best of each, and so on."""
    groups: dict[tuple[str, int | None], list[tuple[float, Path]]] = {}
    for run_dir in finished_runs(root):
        if not RunDir(run_dir).last_checkpoint.is_file():
            continue
        summary = eval_summary(run_dir)
        cached = run_dir / "layer_contribution.json"
        if cached.is_file():
            record = json.loads(cached.read_text())
            if record.get("step") == summary.get("step") and record.get("tokens_asked") == n_tokens:
                continue
        loss = summary.get("val_loss")
        depth = re.search(r"-d(\d+)-", run_dir.name)
        key = (run_dir.parent.name, int(depth.group(1)) if depth else None)
        groups.setdefault(key, []).append(
            (loss if isinstance(loss, float) and math.isfinite(loss) else math.inf, run_dir)
        )
    ranked = [sorted(runs, key=lambda r: r[0]) for _, runs in sorted(groups.items(), key=lambda kv: str(kv[0]))]
    return [runs[i][1] for i in range(max(map(len, ranked), default=0)) for runs in ranked if i < len(runs)]


def measure_contributions(root: Path, n_tokens: int, seconds: float) -> int:
    """Measure (and cache in each run) as many of ``contribution_order``'s runs as ``seconds`` allows."""
    sys.path.insert(0, str(ROOT))
    from resnorm_lm.analysis.block_measurements import run_contribution

    deadline = time.monotonic() + seconds
    todo = contribution_order(root, n_tokens)
    done, slowest = 0, 0.0
    for run_dir in todo:
        if time.monotonic() + slowest > deadline:
            break
        t0 = time.monotonic()
        run_contribution(run_dir, n_tokens)
        slowest = max(slowest, time.monotonic() - t0)
        done += 1
    rest = "" if done == len(todo) else " (time is up: the rest are measured in a later round)"
    print(
        f"layer contribution: measured {done} of {len(todo)} finished run(s) with a checkpoint and no measurement{rest}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the layer contribution of finished runs, while time lasts")
    parser.add_argument("command", choices=["contributions"])
    parser.add_argument("root", type=Path)
    parser.add_argument("--tokens", type=int, required=True, help="as compare's --contribution-tokens")
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    return measure_contributions(args.root, args.tokens, args.seconds)


if __name__ == "__main__":
    sys.exit(main())

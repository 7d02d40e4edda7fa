"""Execute the notebooks with nbclient, from the repository root; exit non-zero when a cell fails.

    python notebooks/run_notebooks.py                      # all three, outputs written back in place
    python notebooks/run_notebooks.py --notebooks 02       # by number, name or path
    python notebooks/run_notebooks.py --small --output-dir /tmp/nb   # the test setting, repo files untouched

``--small`` sets RESNORM_LM_NOTEBOOK_SMALL=1, which notebook 02 reads to shrink its model (4 layers,
one seed); it is meant for the tests. Notebook 03 reads RESNORM_LM_RESULTS and RESNORM_LM_RUNS.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

NOTEBOOK_DIR = Path(__file__).resolve().parent
REPO_ROOT = NOTEBOOK_DIR.parent
SMALL_ENV = "RESNORM_LM_NOTEBOOK_SMALL"


def all_notebooks() -> list[Path]:
    return sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))


def resolve(spec: str) -> Path:
    """A notebook given as a path, a file name, a stem or its number prefix ("02")."""
    path = Path(spec)
    if path.is_file():
        return path.resolve()
    matches = [p for p in all_notebooks() if p.name == spec or p.stem == spec or p.name.startswith(f"{spec}_")]
    if len(matches) != 1:
        names = ", ".join(p.name for p in all_notebooks())
        raise SystemExit(f"no single notebook matches {spec!r}; available: {names}")
    return matches[0]


def execute(path: Path, output: Path, timeout: int, kernel: str) -> bool:
    """Run every cell of ``path`` with the repository root as working directory; write the result to ``output``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=kernel,
        resources={"metadata": {"path": str(REPO_ROOT)}},
        record_timing=False,  # keeps the committed notebooks free of per-run timestamps
    )
    start = time.perf_counter()
    ok = True
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError) as err:
        ok = False
        print(f"FAILED {path.name}:\n{err}", file=sys.stderr)
    finally:
        output.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, output)  # partial outputs too: they show where it failed
    status = "ok" if ok else "FAILED"
    print(f"{status:6s} {path.name} in {time.perf_counter() - start:.1f} s -> {output}", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", nargs="+", default=None, help="numbers, names or paths (default: all)")
    parser.add_argument("--small", action="store_true", help=f"set {SMALL_ENV}=1: smaller models, for tests")
    parser.add_argument("--output-dir", type=Path, default=None, help="write executed copies here (default: in place)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel name (default python3: this Python)")
    args = parser.parse_args(argv)

    paths = [resolve(s) for s in args.notebooks] if args.notebooks else all_notebooks()
    if args.small:
        os.environ[SMALL_ENV] = "1"  # the kernel inherits this process's environment
    os.chdir(REPO_ROOT)
    failed = []
    for path in paths:
        output = (args.output_dir / path.name) if args.output_dir else path
        if not execute(path, output, args.timeout, args.kernel):
            failed.append(path.name)
    if failed:
        print(f"{len(failed)} of {len(paths)} notebooks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

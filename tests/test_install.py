"""``make install``: a half-made ``.venv`` is made again, and torch's index is the one TORCH_INDEX names.

The repair is scripts/ensure_venv.sh, run here against fake environments (a ``python`` that is missing, does
not start, or has no pip) with a fake interpreter that records the ``-m venv`` it is asked for, so nothing is
installed. The Makefile's part, when it runs that script and what it hands pip, is read with ``make -n``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENSURE_VENV = REPO / "scripts" / "ensure_venv.sh"
PYTHON = Path(sys.executable)  # this test's python: it starts and has pip


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def recording_python(tmp_path: Path) -> Path:
    """A python that makes a venv by linking its bin/python to this test's python, and logs each ``-m venv``."""
    return executable(
        tmp_path / "fake-python",
        f"""#!/usr/bin/env bash
if [ "$1 $2" = "-m venv" ]; then
    echo "$3" >> {tmp_path / "made.log"}
    mkdir -p "$3/bin" && ln -s {PYTHON} "$3/bin/python"
    exit
fi
exec {PYTHON} "$@"
""",
    )


def ensure_venv(python: Path, venv: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ENSURE_VENV), str(python), str(venv)], capture_output=True, text=True, timeout=60, env=env
    )


def python_that_does_not_start(venv: Path) -> None:
    executable(venv / "bin" / "python", "#!/usr/bin/env bash\nexit 1\n")


def python_without_pip(venv: Path) -> None:  # -S: no site-packages, where pip lives
    executable(venv / "bin" / "python", f'#!/usr/bin/env bash\nexec {PYTHON} -I -S "$@"\n')


def python_link_to_a_removed_interpreter(venv: Path) -> None:
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(venv / "gone" / "python3.11")


def no_python(venv: Path) -> None:  # `python -m venv` killed before it linked the interpreter
    (venv / "bin").mkdir(parents=True)


@pytest.mark.parametrize(
    "half_made", [python_that_does_not_start, python_without_pip, python_link_to_a_removed_interpreter, no_python]
)
def test_a_half_made_venv_is_removed_and_made_again(half_made, tmp_path):
    venv = tmp_path / ".venv"
    half_made(venv)
    (venv / "left-over").write_text("from the half-made one")
    done = ensure_venv(recording_python(tmp_path), venv)
    assert done.returncode == 0, done.stderr
    assert "is half made" in done.stderr and "making it again" in done.stderr
    assert (tmp_path / "made.log").read_text().split() == [str(venv)]
    assert not (venv / "left-over").exists()
    assert subprocess.run([venv / "bin" / "python", "-c", "import sys, pip"], timeout=60).returncode == 0


def test_a_working_venv_is_left_alone_and_a_missing_one_made(tmp_path):
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(PYTHON)
    (venv / "installed").write_text("packages")
    done = ensure_venv(recording_python(tmp_path), venv)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (venv / "installed").exists() and not (tmp_path / "made.log").exists()

    shutil.rmtree(venv)
    assert ensure_venv(recording_python(tmp_path), venv).returncode == 0
    assert (tmp_path / "made.log").read_text().split() == [str(venv)]


def test_a_python_older_than_3_11_is_refused_with_the_way_to_name_another(tmp_path):
    old = executable(
        tmp_path / "python3.10",
        """#!/usr/bin/env bash
case "$1" in -V) echo "Python 3.10.12" ;; -c) exit 1 ;; *) echo "asked to $*" >&2; exit 3 ;; esac
""",
    )
    done = ensure_venv(old, tmp_path / ".venv")
    assert done.returncode == 2, done.stderr
    assert "needs Python 3.11 or newer" in done.stderr and "Python 3.10.12" in done.stderr
    assert "make install PYTHON=python3.11" in done.stderr and not (tmp_path / ".venv").exists()


def test_a_disk_without_room_for_the_environment_is_refused_before_pip_fills_it(tmp_path):
    env = {**os.environ, "RESNORM_LM_INSTALL_NEEDS_MB": str(10**12)}  # more than any disk holds
    venv = tmp_path / ".venv"
    done = ensure_venv(recording_python(tmp_path), venv, env)
    assert done.returncode == 2, done.stderr
    assert "MB are free on the disk" in done.stderr and "run make install again" in done.stderr
    assert not venv.exists() and not (tmp_path / "made.log").exists()

    (venv / "bin").mkdir(parents=True)  # a working environment is left alone, however full the disk
    (venv / "bin" / "python").symlink_to(PYTHON)
    done = ensure_venv(recording_python(tmp_path), venv, env)
    assert done.returncode == 0 and done.stderr == "", done.stderr


# ---------------------------------------------------------------- the Makefile's part


@pytest.fixture
def installed_copy(tmp_path):
    """The files ``make install`` reads, and a .venv whose stamp is newer than all of them."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    for name in ("Makefile", "pyproject.toml", "constraints.txt", "setup.py"):
        shutil.copy(REPO / name, tmp_path / name)
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(PYTHON)
    stamp = venv / ".installed-stamp"
    stamp.touch()
    newest = max(os.stat(p).st_mtime for p in (*tmp_path.iterdir(), PYTHON.resolve()) if p.is_file())
    os.utime(stamp, (newest + 10, newest + 10))
    return tmp_path


def make_dry_run(folder: Path, *variables: str, target: str = "install") -> str:
    done = subprocess.run(["make", "-n", target, *variables], cwd=folder, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_install_always_checks_the_venv_and_installs_only_when_out_of_date(installed_copy):
    up_to_date = make_dry_run(installed_copy)
    assert "scripts/ensure_venv.sh python3 .venv" in up_to_date  # the check that removes a half-made one
    assert "is up to date" in up_to_date and "pip install" not in up_to_date
    (installed_copy / ".venv" / ".installed-stamp").unlink()  # as after that removal, or a killed pip install
    assert ".venv/bin/python -m pip install" in make_dry_run(installed_copy)


def test_the_targets_that_need_the_venv_remake_it_when_its_python_is_gone(installed_copy):
    assert "pip install" not in make_dry_run(installed_copy, target="test")
    (installed_copy / ".venv" / "bin" / "python").unlink()
    (installed_copy / ".venv" / "bin" / "python").symlink_to(installed_copy / "removed" / "python3.11")
    commands = make_dry_run(installed_copy, target="test")
    assert "scripts/ensure_venv.sh python3 .venv" in commands and ".venv/bin/python -m pip install" in commands


def test_torch_index_is_handed_to_pip_only_when_set(installed_copy):
    (installed_copy / ".venv" / ".installed-stamp").unlink()
    plain = " ".join(make_dry_run(installed_copy).replace("\\\n", " ").split())
    assert "-c constraints.txt torch==2.13.0 -e" in plain and "index-url" not in plain
    cpu = " ".join(make_dry_run(installed_copy, "TORCH_INDEX=https://download.pytorch.org/whl/cpu").split())
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in cpu

"""A wheel, not the repository: built from the source, installed into a fresh venv, it trains the smoke profile
from a folder outside the repository, with the recipes it carries inside the package; and the order in which
recipes are looked for (RESNORM_LM_RECIPES, the package's copy, the checkout's recipes/).

Offline and without downloading torch again: the wheel is built with this environment's setuptools (no build
isolation) and installed with ``--no-deps``; the fresh venv finds the dependencies through a ``.pth`` line naming
this environment's site-packages (a plain path: the editable install's finder there is not run).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "resnorm_lm", "recipes"]  # what a build reads


def run(*command, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(map(str, command))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_a_wheel_installed_into_a_fresh_venv_trains_the_smoke_profile_outside_the_repository(tmp_path, smoke_corpus):
    source = tmp_path / "source"  # a copy: the build's own build/ folder never mixes with the repository's
    source.mkdir()
    for name in SOURCE:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, source / name)
    run(
        sys.executable,
        "-m",
        "pip",
        "--isolated",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--wheel-dir",
        tmp_path / "dist",
        source,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("resnorm_lm-*.whl")

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    site_packages = Path(
        run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path).stdout.strip()
    )
    (site_packages / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run(
        sys.executable,
        "-m",
        "pip",
        "--isolated",
        "--python",
        python,
        "install",
        "--no-deps",
        "--no-index",
        wheel,
        cwd=tmp_path,
    )

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RESNORM_LM_RECIPES")}
    find_package = "import importlib.util; print(importlib.util.find_spec('resnorm_lm').origin)"  # no torch import
    package = run(python, "-c", find_package, cwd=work, env=env).stdout.strip()
    assert Path(package) == site_packages / "resnorm_lm" / "__init__.py"  # the wheel's code, not the repository's
    packaged = site_packages / "resnorm_lm" / "recipes"  # and no recipes/ outside the package to fall back on
    shipped = sorted(p.relative_to(packaged).as_posix() for p in packaged.rglob("*.yaml"))
    assert shipped == sorted(p.relative_to(REPO / "recipes").as_posix() for p in (REPO / "recipes").rglob("*.yaml"))
    assert not (site_packages / "recipes").exists()

    done = run(
        venv / "bin" / "resnorm-lm",
        "fit",
        "--recipe",
        "prenorm-12l",
        "--profile",
        "smoke",
        "--data.corpus=text",
        f"--data.files=[{smoke_corpus}]",
        "--trainer.enable_progress_bar=false",
        cwd=work,
        env=env,
    )
    assert "RESULT run=runs/prenorm-12l/smoke-seed1 step=6 " in done.stdout, done.stdout[-2000:]
    assert (work / "runs" / "prenorm-12l" / "smoke-seed1" / "checkpoints" / "last.ckpt").is_file()
    manifest = json.loads((work / "runs" / "prenorm-12l" / "smoke-seed1" / "manifest.json").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert manifest["code_revision"] == f"resnorm-lm {version} (installed package)"  # not the git state around it


def test_an_installed_package_runs_sweeps_in_the_current_directory_and_names_its_version(tmp_path, monkeypatch):
    """From a wheel, REPO_ROOT is site-packages: a sweep's jobs run where the user is, not there."""
    from resnorm_lm.train import runs

    assert runs.source_checkout() == REPO and runs.working_root() == REPO  # this checkout
    monkeypatch.setattr(runs, "REPO_ROOT", tmp_path / "site-packages")
    monkeypatch.chdir(tmp_path)
    assert runs.source_checkout() is None and runs.working_root() == tmp_path
    assert runs.code_revision().startswith("resnorm-lm ") and runs.code_revision().endswith("(installed package)")


def test_recipes_are_found_through_the_setting_then_in_the_package_then_in_the_checkout(tmp_path, monkeypatch):
    from resnorm_lm.train import recipes

    monkeypatch.delenv("RESNORM_LM_RECIPES", raising=False)
    assert recipes.recipes_dir() == REPO / "recipes"  # a checkout's package holds no copy
    packaged = tmp_path / "site-packages" / "resnorm_lm" / "recipes"
    packaged.mkdir(parents=True)
    monkeypatch.setattr(recipes, "PACKAGED_RECIPES", packaged)
    assert recipes.recipes_dir() == packaged
    monkeypatch.setenv("RESNORM_LM_RECIPES", str(tmp_path / "my-recipes"))
    assert recipes.recipes_dir() == tmp_path / "my-recipes"

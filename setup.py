"""The build's one step beyond pyproject.toml: the wheel carries the recipes.

``recipes/`` at the top of the repository is where users read and edit recipes and profiles. A wheel has no
repository around it, so the build copies its YAML files into the package as ``resnorm_lm/recipes/``, where
``resnorm_lm.train.recipes`` finds them in an installed package.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

RECIPES = Path(__file__).resolve().parent / "recipes"


class BuildPyWithRecipes(build_py):
    """``build_py``, then ``recipes/**/*.yaml`` copied to ``<build>/resnorm_lm/recipes/``."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "resnorm_lm" / "recipes"
        shutil.rmtree(target, ignore_errors=True)  # a recipe deleted since the last build leaves no copy behind
        for source in RECIPES.rglob("*.yaml"):
            copy = target / source.relative_to(RECIPES)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, copy)


setup(cmdclass={"build_py": BuildPyWithRecipes})

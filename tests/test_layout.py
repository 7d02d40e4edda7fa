"""The package's layout: three wings whose imports run one way, every import naming a module that exists, and a
run written before the move (tests/fixtures/run_before_wings) that still resumes, evaluates and samples."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.smoke import run_cli

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "resnorm_lm"
FIXTURE = REPO / "tests" / "fixtures" / "run_before_wings"
# what each wing may not import, at the top or inside a function: cli -> analysis -> train -> data, model
FORBIDDEN = {
    "model": ("data", "train", "analysis", "cli"),
    "data": ("model", "train", "analysis", "cli"),
    "train": ("analysis", "cli"),
    "analysis": ("cli",),
}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.startswith("resnorm_lm")}


def test_each_wing_imports_only_the_wings_below_it():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        wing = path.relative_to(PACKAGE).parts[0]
        for name in imported_modules(path):
            parts = name.split(".")
            if len(parts) > 1 and parts[1] in FORBIDDEN.get(wing, ()):
                violations.append(f"{path.relative_to(REPO)} imports {name}")
    assert not violations, "\n".join(violations)


def missing_imports(path: Path) -> list[str]:
    """The ``resnorm_lm`` names ``path`` imports that are neither a module nor a name its module defines."""
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names if alias.name.startswith("resnorm_lm")]
            missing += [name for name in modules if importlib.util.find_spec(name) is None]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("resnorm_lm"):
            if importlib.util.find_spec(node.module) is None:
                missing.append(node.module)
                continue
            try:
                module = importlib.import_module(node.module)
            except ImportError:  # it exists, but needs what this machine lacks (triton): its names go unchecked
                continue
            missing += [f"{node.module}.{alias.name}" for alias in node.names if not defines(module, alias.name)]
    return missing


def defines(module, name: str) -> bool:
    """``from module import name`` works: a name the module defines, or a submodule of a package."""
    is_package = hasattr(module, "__path__")
    return hasattr(module, name) or is_package and importlib.util.find_spec(f"{module.__name__}.{name}") is not None


def test_every_import_of_the_package_in_the_repository_names_a_module_that_exists():
    files = [*PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py")]
    missing = [f"{p.relative_to(REPO)} imports {name}" for p in files for name in missing_imports(p)]
    assert not missing, "\n".join(missing)


def test_the_package_root_holds_only_the_wings_the_command_and_shared_pieces():
    modules = sorted(p.name for p in PACKAGE.iterdir() if p.suffix == ".py")
    assert modules == ["__init__.py", "__main__.py", "cli.py", "errors.py", "registry.py", "targets.py"]
    for wing in ("model", "train", "analysis", "data"):
        doc = importlib.import_module(f"resnorm_lm.{wing}").__doc__
        assert doc and "Imports" in doc or wing == "data", wing  # each wing's docstring says what it may import


def test_the_public_names_are_where_they_were():
    from resnorm_lm import GPT, NORMS, PLACEMENTS, GPTConfig
    from resnorm_lm.model import count_parameters

    assert count_parameters(GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=1, n_embd=8))) > 0
    assert "layernorm" in NORMS and "prenorm" in PLACEMENTS


@pytest.fixture
def run_before_wings(tmp_path, monkeypatch):
    """The fixture run (stopped at step 2 of 4) under a fresh root. Its checkpoint names its corpus by a path
    relative to the repository and uses the default data cache: run from there, with a private cache."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("RESNORM_LM_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "runs"
    shutil.copytree(FIXTURE / "prenorm-12l", root / "prenorm-12l")
    return root, root / "prenorm-12l" / "smoke-seed1"


@pytest.mark.training
def test_a_run_written_before_the_move_resumes_to_its_end(run_before_wings, capsys):
    root, run_dir = run_before_wings
    code = run_cli(
        [
            "fit",
            "--recipe",
            "prenorm-12l",
            "--profile",
            "smoke",
            "--data.corpus=text",
            "--data.files=[tests/fixtures/run_before_wings/corpus/*.txt]",
            "--trainer.enable_progress_bar=false",
            f"--run.root={root}",
            "--model.arch.n_layer=2",
            "--model.arch.n_embd=16",
            "--trainer.max_steps=4",
            # what it trained with before data orders followed the seed and warmups were fractions (its 2
            # warmup steps of 4): a resume gives the run's own settings
            "--data.seed=1337",
            "--model.optim.warmup_fraction=0.5",
            "--run.checkpoint_every=1",
            "--trainer.val_check_interval=2",
            "--ckpt_path=last",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    assert f"RESULT run={run_dir} step=4" in out.out
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 4 and state["tokens_seen"] == 4 * 4 * 32  # 4 steps of batch 4 x context 32
    segments = json.loads((run_dir / "manifest.json").read_text())["segments"]
    assert [seg["resumed_from_step"] for seg in segments] == [0, 2], segments  # the old segment, then the resume


@pytest.mark.training
def test_a_checkpoint_written_before_the_move_evaluates_and_samples(run_before_wings, capsys):
    _, run_dir = run_before_wings
    assert run_cli(["eval", str(run_dir), "--split", "validation"]) == 0, capsys.readouterr().err[-2000:]
    assert "validation" in capsys.readouterr().out
    assert run_cli(["generate", str(run_dir), "--prompt", "The", "--tokens", "8"]) == 0
    assert capsys.readouterr().out.startswith("The")

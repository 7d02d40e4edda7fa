"""Old module names of the flat layout, kept importable: ``resnorm_lm.lightning_module`` is
``resnorm_lm.train.lightning_module`` (the same module object), so user code, configs naming a
``class_path`` and ``python -m resnorm_lm.precision`` written before the move keep working."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {  # old name -> new name (resnorm_lm.model became the package that re-exports GPT, GPTConfig, ...)
    **{f"resnorm_lm.{m}": f"resnorm_lm.model.{m}" for m in ("placements", "norms", "norms_triton")},
    "resnorm_lm.generate": "resnorm_lm.model.decoding",
    "resnorm_lm.device_verdicts": "resnorm_lm.train.divergence_on_device",
    "resnorm_lm.checkpoints": "resnorm_lm.train.loaded_run",
    "resnorm_lm.checkpoint_files": "resnorm_lm.train.checkpoint_io",
    "resnorm_lm.sample_cli": "resnorm_lm.analysis.generate",
    "resnorm_lm.kernels": "resnorm_lm.model.kernels",
    "resnorm_lm.kernels.add_norm": "resnorm_lm.model.kernels.add_norm",
    "resnorm_lm.kernels.add_norm_ops": "resnorm_lm.model.kernels.add_norm_ops",
    **{
        f"resnorm_lm.{m}": f"resnorm_lm.train.{m}"
        for m in (
            "lightning_module",
            "trainer",
            "optim",
            "precision",
            "monitors",
            "logging",
            "recipes",
            "runs",
            "resume",
            "config_checks",
            "summary",
            "diagnostics",
        )  # fmt: skip
    },
    **{
        f"resnorm_lm.{m}": f"resnorm_lm.analysis.{m}"
        for m in ("evaluate", "compare", "sweep", "plots", "layer_contribution")
    },
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name and loads it as the module under its new name."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        new = importlib.util.find_spec(MOVED[fullname])
        return importlib.util.spec_from_loader(fullname, self, is_package=new.submodule_search_locations is not None)

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:
        """Already executed under its new name."""

    def get_code(self, fullname):  # ``python -m <old name>`` runs the new module's code as __main__
        new = MOVED[fullname]
        return importlib.util.find_spec(new).loader.get_code(new)


def install() -> None:
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Alias())  # before the path finder, which would load a second copy of a module

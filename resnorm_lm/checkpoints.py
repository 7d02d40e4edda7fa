"""Loading a trained run back: the model, its data module and where it came from."""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from resnorm_lm.data.datamodule import TextDataModule
from resnorm_lm.lightning_module import LanguageModel
from resnorm_lm.model import GPTConfig
from resnorm_lm.norms import NORM_BACKENDS
from resnorm_lm.optim import OptimConfig


class CheckpointError(ValueError):
    """A path that is not a usable resnorm-lm run or checkpoint."""


@dataclass
class LoadedRun:
    model: LanguageModel
    datamodule: TextDataModule
    checkpoint: Path
    run_dir: Path | None  # the run directory when the checkpoint lives in runs/<recipe>/<profile>-seed<k>/
    global_step: int


def find_checkpoint(path: str | Path) -> tuple[Path, Path | None]:
    """A run directory gives its checkpoints/last.ckpt (the final weights); a .ckpt file is taken as is."""
    path = Path(path)
    if path.is_dir():
        ckpt = path / "checkpoints" / "last.ckpt"
        if not ckpt.is_file():
            raise CheckpointError(f"{path} is not a run directory with checkpoints/last.ckpt; train it first")
        return ckpt, path
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist (give a run directory or a .ckpt file)")
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else None
    return path, run_dir


def read_checkpoint(ckpt: Path) -> dict:
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, corrupt, or not a torch file at all
        reason = f"{type(err).__name__}: {str(err)[:200]}"
        raise CheckpointError(
            f"cannot read {ckpt} ({reason}); it is corrupt, truncated or not a checkpoint "
            "(retrain, or resume from another one)"
        ) from None
    if not isinstance(state, dict) or "state_dict" not in state or "arch" not in state.get("hyper_parameters", {}):
        raise CheckpointError(f"{ckpt} is not a resnorm-lm checkpoint (no model hyperparameters)")
    return state


def usable_backend(arch: dict) -> dict:
    """The fused backend's weights are plain norm weights: fall back to torch where triton cannot run."""
    if arch.get("norm_backend") == "triton":
        try:
            NORM_BACKENDS.get("triton").check_available()
        except ValueError as err:
            print(f"resnorm-lm: {err}; evaluating with norm_backend torch (same weights)", file=sys.stderr)
            return {**arch, "norm_backend": "torch"}
    return arch


def load_run(path: str | Path, cache_dir: str | None = None) -> LoadedRun:
    """The model (eval mode, on CPU) and a data module configured as in training."""
    ckpt, run_dir = find_checkpoint(path)
    state = read_checkpoint(ckpt)
    arch = usable_backend(state["hyper_parameters"]["arch"])
    optim = state["hyper_parameters"].get("optim", {})
    known = {f.name for f in fields(OptimConfig)}
    model = LanguageModel(arch=GPTConfig(**arch), optim=OptimConfig(**{k: v for k, v in optim.items() if k in known}))
    try:
        model.load_state_dict(state["state_dict"])
    except RuntimeError as err:
        raise CheckpointError(f"{ckpt}: its weights do not fit its own architecture: {str(err)[:300]}") from None
    model.eval()
    data = {k: v for k, v in state.get("datamodule_hyper_parameters", {}).items() if not k.startswith("_")}
    if not data:
        raise CheckpointError(f"{ckpt} has no data settings (datamodule_hyper_parameters)")
    if cache_dir is not None:
        data["cache_dir"] = cache_dir
    return LoadedRun(model, TextDataModule(**data), ckpt, run_dir, int(state.get("global_step", 0)))

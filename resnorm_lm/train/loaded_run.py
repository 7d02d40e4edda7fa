"""Loading a trained run back: the model, its data module (prepared, on the data it was trained on) and
where it came from."""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from resnorm_lm.data.datamodule import TextDataModule
from resnorm_lm.data.errors import CorpusChangedError, DataError
from resnorm_lm.errors import ResnormError
from resnorm_lm.model import exported
from resnorm_lm.model.gpt import GPTConfig
from resnorm_lm.model.norms import NORM_BACKENDS
from resnorm_lm.train.checkpoint_io import CheckpointFileError, read_checkpoint_file
from resnorm_lm.train.lightning_module import LanguageModel, data_identity, identity_differences
from resnorm_lm.train.optim import OptimConfig
from resnorm_lm.train.runs import RunDir


class CheckpointError(ResnormError, ValueError):
    """A path that is not a usable resnorm-lm run or checkpoint."""


@dataclass
class LoadedRun:
    model: LanguageModel
    datamodule: TextDataModule
    checkpoint: Path
    run_dir: Path | None  # the run directory when the checkpoint lives in runs/<recipe>/<profile>-seed<k>/
    global_step: int
    precision: str | None  # the precision the run trained with; None when neither checkpoint nor manifest says


def find_checkpoint(path: str | Path) -> tuple[Path, Path | None]:
    """A run directory gives its checkpoints/last.ckpt (the final weights); a .ckpt file is taken as is."""
    path = Path(path)
    if path.is_dir():
        ckpt = RunDir(path).last_checkpoint
        if not ckpt.is_file():
            raise CheckpointError(f"{path} is not a run directory with checkpoints/last.ckpt; train it first")
        return ckpt, path
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist (give a run directory or a .ckpt file)")
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else None
    return path, run_dir


def read_checkpoint(ckpt: Path) -> dict:
    try:
        state = read_checkpoint_file(ckpt)  # as data: weights_only=True
    except CheckpointFileError as err:
        raise CheckpointError(f"{err} (retrain, or use another checkpoint)") from None
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


def run_manifest(run_dir: Path | None) -> dict[str, Any]:
    return RunDir(run_dir).manifest() if run_dir is not None else {}


def recorded_identity(state: dict, manifest: dict) -> dict[str, str] | None:
    """The data identity the run trained on: the checkpoint's, else its run directory's manifest's."""
    if "data_identity" in state:
        return state["data_identity"]
    data = manifest.get("data") or {}
    identity = {k: data[k] for k in ("corpus_fingerprint", "tokenizer_sha256", "corpus_revision") if data.get(k)}
    return identity or None


def describe_data(data: dict[str, Any]) -> str:
    """``data.corpus=text data.files=[...]``: the settings that name the corpus."""
    parts = [f"data.corpus={data.get('corpus', 'shakespeare')}"]
    parts += [f"data.{k}={data[k]}" for k in ("files", "max_chars") if data.get(k) is not None]
    return " ".join(parts)


def data_differences(dm: TextDataModule, expected: dict[str, str] | None) -> list[str]:
    """Prepare ``dm``'s data and list how it differs from the data identity a checkpoint records (empty: the
    same data). A changed corpus is found before any tokenizer is trained on it; a DataError (files moved or
    unreadable, a Hub corpus offline) is the caller's to report."""
    fingerprint = expected.get("corpus_fingerprint") if expected else None
    try:
        dm.setup_expecting(fingerprint)
    except CorpusChangedError as err:
        return identity_differences({"corpus_fingerprint": fingerprint}, {"corpus_fingerprint": err.found})
    return identity_differences(expected or {}, data_identity(dm.manifest))


def prepare_checked(ckpt: Path, dm: TextDataModule, data: dict[str, Any], expected: dict[str, str] | None) -> None:
    """Prepare the run's data and refuse, before anything is scored or written, data that is not what it
    trained on (as resume does)."""
    try:
        differences = data_differences(dm, expected)
    except DataError as err:  # files moved or unreadable, a Hub corpus offline
        raise CheckpointError(
            f"cannot prepare the data {ckpt} was trained on ({describe_data(data)}): {err}. Put the data back "
            "where it was trained from"
        ) from None
    if differences:
        raise CheckpointError(
            f"{ckpt} was trained on other data than {describe_data(data)} holds now: {'; '.join(differences)}. "
            "Scoring or sampling it with this data and its tokenizer would mean nothing: restore the corpus it "
            "was trained on, or use a run trained on this data"
        )


def trained_data(source: Path, data: dict[str, Any], cache_dir: str | None, identity) -> TextDataModule:
    """The data module of the data a checkpoint or export (``source``) was trained on, prepared and checked
    against its recorded identity; ``cache_dir`` in place of the recorded one where given."""
    if cache_dir is not None:
        data = {**data, "cache_dir": cache_dir}
    try:
        dm = TextDataModule(**data)
    except ValueError as err:
        raise CheckpointError(f"{source}: its data settings are not valid here: {err}") from None
    prepare_checked(source, dm, data, identity)
    return dm


def load_run(path: str | Path, cache_dir: str | None = None) -> LoadedRun:
    """The model (eval mode, on CPU) and its data module, set up on the data it was trained on. ``path``: a run
    directory, a .ckpt file, or a folder that ``resnorm-lm export`` wrote."""
    if exported.is_export(Path(path)):
        return load_export(Path(path), cache_dir)
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
    manifest = run_manifest(run_dir)
    dm = trained_data(ckpt, data, cache_dir, recorded_identity(state, manifest))
    precision = state.get("precision") or manifest.get("precision")
    return LoadedRun(model, dm, ckpt, run_dir, int(state.get("global_step", 0)), precision)


def load_export(folder: Path, cache_dir: str | None = None) -> LoadedRun:
    """An exported run (``resnorm_lm/model/exported.py``: safetensors and JSON, no pickle) as ``load_run`` gives a
    checkpoint: its model, and its data module set up on the data it was trained on (checked as a checkpoint's)."""
    try:
        gpt, meta = exported.load_model(folder)
    except exported.ExportError as err:
        raise CheckpointError(str(err)) from None
    model = LanguageModel(arch=gpt.config)
    model.model.load_state_dict(gpt.state_dict())
    model.eval()
    data = dict(meta.get("data") or {})
    if not data:
        raise CheckpointError(f"{folder}: its resnorm_lm.json names no data settings")
    dm = trained_data(folder, data, cache_dir, meta.get("data_identity"))
    run = meta.get("run") or {}
    return LoadedRun(model, dm, folder, None, int(run.get("step") or 0), run.get("precision"))

"""Checkpoint files: read as data, never as code, and written all or nothing (``AtomicCheckpointIO``).

A checkpoint is a pickle, and a pickle can name any importable callable to be called while it is read
(``os.system`` through an object's ``__reduce__``, say). People share checkpoints and schedulers resume
from paths that others can write, so every checkpoint this project reads, itself or through Lightning
(its ``AtomicCheckpointIO``, below), is read by ``read_checkpoint_file``: a
``torch.load(weights_only=True)``, whose unpickler builds only tensors, containers and plain values and
refuses every other global before calling it. What resnorm-lm's own checkpoints hold is exactly that
(model and optimizer state, the LR schedule, RNG states as tensors, the divergence guard's records,
hyperparameters as plain dicts), so no extra global is allowed. A refused file is reported with the
first global it names, and without torch's advice to load it unrestricted: that is the one thing to
avoid with a file from elsewhere.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from resnorm_lm.data.cache import atomic_write
from resnorm_lm.errors import ResnormError

FULL_BYTES = 64 * 2**20  # less free space than this after a failed write: the disk is what is full


class CheckpointFileError(ResnormError, ValueError):
    """A file that cannot be read as a checkpoint: corrupt, truncated, not a torch file, or unsafe."""


class CheckpointWriteError(ResnormError, OSError):
    """A checkpoint that could not be written (a full disk, most often): nothing of it was left behind, and the
    previous checkpoint under its name is whole (``atomic_write``)."""

    def __init__(self, path: Path, cause: BaseException) -> None:
        self.path, self.cause = path, cause
        folder = next((p for p in (path.parent, *path.parents) if p.exists()), Path("/"))
        self.free = shutil.disk_usage(folder).free
        full = getattr(cause, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or self.free < FULL_BYTES
        why = "the disk is full" if full else f"{type(cause).__name__}: {str(cause).splitlines()[0][:160]}"
        super().__init__(f"could not write the checkpoint {path}: {why} ({self.free / 2**20:.0f} MiB free on the "
                         f"disk of {folder})")  # fmt: skip


class UnsafeCheckpointError(CheckpointFileError):
    """A file that holds objects a checkpoint never holds: it was refused before any of them was built."""


def read_checkpoint_file(path: str | os.PathLike, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` with errors that say what is wrong with the file.

    ``mmap=True`` maps the tensors' storage instead of reading it (cheap when only a few fields are needed).
    """
    path = Path(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:  # the weights-only unpickler refused an object, or the bytes
        unsafe = unsafe_globals(path, err)
        if unsafe:
            raise UnsafeCheckpointError(unsafe_message(path, unsafe[0])) from None
        raise CheckpointFileError(not_a_checkpoint(path, f"UnpicklingError: {unpickler_reason(err)}")) from None
    except Exception as err:  # truncated, corrupt, a directory, not a torch file at all
        if mmap and "mmap" in str(err):  # a legacy (non-zip) file cannot be mapped: read it whole
            return read_checkpoint_file(path, map_location, mmap=False)
        raise CheckpointFileError(not_a_checkpoint(path, f"{type(err).__name__}: {str(err)[:200]}")) from None


def unsafe_globals(path: Path, err: Exception) -> list[str]:
    """The globals the file names that a checkpoint never holds, read without running anything."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)  # opcodes only, nothing is called
    except Exception:  # a legacy (non-zip) file: the unpickler's own message names the one it met
        names = []
    found = re.search(r"(?:GLOBAL|Unsupported global:?)\s+(\S+?)[\s,]", str(err))
    return names or ([found.group(1)] if found else [])


def unpickler_reason(err: Exception) -> str:
    """What the weights-only unpickler could not read, without torch's advice to load the file unrestricted."""
    found = re.search(r"(Unsupported operand[^\n]*|Unsupported class[^\n]*)", str(err))
    return found.group(1).strip() if found else "not a weights-only pickle"


def not_a_checkpoint(path: Path, reason: str) -> str:
    return f"cannot read checkpoint {path} ({reason}); it is corrupt, truncated or not a checkpoint"


def unsafe_message(path: Path, first: str) -> str:
    return (
        f"refusing to load {path}: it contains objects a checkpoint never holds (the first is {first}). "
        "Reading it could run code from the file, so nothing of it was loaded. A resnorm-lm checkpoint holds "
        "only tensors, numbers, strings and containers: use a checkpoint that resnorm-lm wrote, from a source "
        "you trust"
    )


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint reader and writer, reading as data and writing all or nothing.

    Writes go through the project's one atomic writer (``resnorm_lm.data.cache.atomic_write``: a temp file in
    the same folder, fsync, rename, fsync of the folder): a process killed at any moment leaves either the
    previous complete file or the new complete file under the checkpoint's name, never a partial one. A leftover
    ``.tmp-*`` file is never taken for a checkpoint and is removed at the next start (``remove_temp_files``).

    Lightning reads checkpoints through this plugin too (resume): always as data,
    ``weights_only=True``, whatever Lightning asks (``read_checkpoint_file``).
    """

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        return read_checkpoint_file(path, map_location=map_location or "cpu")

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
        try:
            with atomic_write(path, "wb") as f:
                torch.save(checkpoint, f)
        except (OSError, RuntimeError) as err:  # torch's zip writer reports a short write as a RuntimeError
            raise CheckpointWriteError(Path(path), err) from err

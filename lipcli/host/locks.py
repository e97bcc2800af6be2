"""One writer per run: exclusive, process-lifetime locks on a run directory and an output path.

``lip train`` holds two locks for the whole run (rank 0 of a torchrun job only): one on its
run directory (``RUN_DIR/.lipcli.lock``) and one on its model file (``.<name>.lipcli.lock``
beside it).  A second run that would write either is refused with a :class:`LockedError`
naming the process that holds the lock.

The locks are POSIX advisory locks (``fcntl.flock``) on small files that hold the owner's
pid.  The kernel drops a lock when its process dies, however it dies (``kill -9``
included), so a lock file left behind by a killed run is *stale*: it is not locked, and
the next run takes it over.  A lock file is removed when its lock is released; a process
that locked a file that was removed in the meantime retries on the new file, so two
processes never both believe they hold the same lock.  On systems without ``fcntl``
(Windows) locking is skipped.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from lipcli.sdk.errors import LipError

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows: no locking
    fcntl = None  # type: ignore[assignment]

#: the lock file inside a run directory
RUN_DIR_LOCK = ".lipcli.lock"


class LockedError(LipError):
    """Another live process holds the lock (exit 1).  ``holder``: its pid (or ``None``)."""

    def __init__(self, message: str, holder: int | None) -> None:
        super().__init__(message)
        self.holder = holder


def run_dir_lock_path(run_dir: Path) -> Path:
    return Path(run_dir) / RUN_DIR_LOCK


def output_lock_path(out: Path) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}.lipcli.lock"


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        return int(text.split()[0]) if text else None
    except (OSError, ValueError, IndexError):
        return None


def _locked(what: str, holder: int | None) -> LockedError:
    who = f"process {holder}" if holder else "another process"
    return LockedError(
        f"{what} is in use by another lipcli process ({who}: a training run or a certification "
        "writing its results); wait for it to finish, or choose another output", holder,
    )


@dataclass
class FileLock:
    """An exclusive lock on ``path``; :meth:`acquire` raises :class:`LockedError` if taken."""

    path: Path
    what: str  # e.g. "run directory runs/x" (for messages)
    fd: int | None = field(default=None, repr=False)

    def acquire(self) -> "FileLock":
        if fcntl is None:  # pragma: no cover
            return self
        for _ in range(10):  # retries only when the file was replaced under us
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read_pid(fd)
                os.close(fd)
                raise _locked(self.what, holder) from None
            try:  # the file we locked must still be the one at the path
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self.fd = fd
            return self
        raise LipError(f"cannot lock {self.what}: {self.path} keeps changing")

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # while still locked: nobody else can hold this file
        os.close(self.fd)  # releases the lock
        self.fd = None


def check_unlocked(path: Path, what: str) -> None:
    """Raise :class:`LockedError` if a live process holds the lock file ``path`` (a probe:
    nothing is created, and a stale file is left for :meth:`FileLock.acquire` to take over)."""
    if fcntl is None:  # pragma: no cover
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file: nobody holds it
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            raise _locked(what, _read_pid(fd)) from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def check_run_unlocked(run_dir: Path, out: Path) -> None:
    """Before any work: neither the run directory nor the model file is held by a live run."""
    check_unlocked(run_dir_lock_path(run_dir), f"run directory {run_dir}")
    check_unlocked(output_lock_path(out), f"model file {out}")


@contextlib.contextmanager
def run_locks(run_dir: Path, out: Path, *, enabled: bool = True) -> Iterator[list[FileLock]]:
    """Hold the run-directory lock and the output-path lock (in that order) until the block
    ends; both directories must exist.  ``enabled=False`` (ranks other than 0) holds none."""
    held: list[FileLock] = []
    try:
        if enabled:
            held.append(FileLock(run_dir_lock_path(run_dir), f"run directory {run_dir}").acquire())
            held.append(FileLock(output_lock_path(out), f"model file {out}").acquire())
        yield held
    finally:
        for lock in reversed(held):
            lock.release()

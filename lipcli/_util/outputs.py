"""Can an output be written?  Checked before any work starts (``lip certify``, ``lip
lipschitz --write``, ``lip bench -o``, the run directory of ``lip train``), so that nothing
is computed for nothing; every failure is a :class:`LipUsageError` (exit 2)."""

from __future__ import annotations

import os
from pathlib import Path

from lipcli.sdk.errors import LipUsageError


def cannot_create_in(directory: Path) -> str | None:
    """Why no file can be created in ``directory`` (None if one can): ``os.access`` first
    (read-only file systems, permissions), then a real probe (a temporary file, removed at
    once), which also catches what ``access`` does not see (root on special file systems,
    ACLs)."""
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"directory {directory} is not writable (read-only?)"
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=directory, prefix=".lipcli-probe-"):
            pass
    except OSError as exc:
        return f"cannot create files in {directory}: {exc.strerror or exc}"
    return None


def check_output_file(path: str | os.PathLike, option: str) -> Path:
    """Fail early (:class:`LipUsageError`, exit 2) unless a file can be written at ``path``
    (the value of ``option``): not a directory, in an existing writable directory, not a
    read-only file.  Called before any work starts, so that nothing is computed for
    nothing."""
    p = Path(path)
    if p.is_dir():
        raise LipUsageError(f"{option} {p} is a directory; give a file name")
    parent = p.parent
    if not parent.exists():
        raise LipUsageError(f"cannot write {p} ({option}): directory {parent} does not exist")
    if not parent.is_dir():
        raise LipUsageError(f"cannot write {p} ({option}): {parent} is not a directory")
    if p.exists() and not os.access(p, os.W_OK):
        raise LipUsageError(f"cannot write {p} ({option}): the file is not writable")
    reason = cannot_create_in(parent)
    if reason:
        raise LipUsageError(f"cannot write {p} ({option}): {reason}")
    return p


def check_model_writable(path: str | os.PathLike, hint: str | None = None) -> None:
    """The write-back of results into the model file needs a writable file in a writable
    directory (atomic rewrite: temporary file + rename); fail before any work otherwise, with
    ``hint`` (what the caller can do instead) appended."""
    p = Path(path)
    if not p.is_file():
        return  # missing / not a file: reported by the loader
    parent = p.parent
    reason = "the file is not writable" if not os.access(p, os.W_OK) else cannot_create_in(parent)
    if not reason:
        return
    raise LipUsageError(f"cannot store the results in {p}: {reason}" + (f"; {hint}" if hint else ""))

"""Where runs live (``./runs`` or ``$LIPCLI_RUNS``) and the default model of the commands
that take one (``lip certify``, ``lip lipschitz``, ``lip info``, ``lip export`` without
MODEL): the most recently written model file under that directory."""

from __future__ import annotations

import os
from pathlib import Path

from lipcli.sdk.errors import LipUsageError

#: environment variable naming the runs directory (default ``runs`` in the working directory)
RUNS_ENV = "LIPCLI_RUNS"
#: model files are ``*.safetensors`` files that are not training checkpoints
MODEL_SUFFIX = ".safetensors"
_NOT_MODELS = ("checkpoint.safetensors", "best.safetensors")


def runs_root() -> Path:
    """``$LIPCLI_RUNS`` when set (and not empty), else ``./runs``."""
    value = os.environ.get(RUNS_ENV, "").strip()
    return Path(value).expanduser() if value else Path("runs")


def _is_model_file(path: Path) -> bool:
    """A safetensors file whose header metadata says ``lipcli.format: "lipcli-model"`` (reads
    the header only)."""
    import json

    if path.name in _NOT_MODELS or path.name.startswith("."):
        return False
    try:
        with open(path, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            if not 0 < size <= 100_000_000:
                return False
            header = json.loads(fh.read(size))
        return header.get("__metadata__", {}).get("lipcli.format") == '"lipcli-model"'
    except (OSError, ValueError, AttributeError):
        return False


def _suffixed_files(base: Path) -> list[Path]:
    """Every ``*.safetensors`` under ``base``, following symlinked directories (a run
    directory linked into the runs directory counts), each real directory once."""
    found, seen = [], set()
    for dirpath, dirnames, filenames in os.walk(base, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a link loop or a second link to the same directory
            dirnames[:] = []
            continue
        seen.add(real)
        found += [Path(dirpath) / name for name in filenames if name.endswith(MODEL_SUFFIX)]
    return found


def latest_model(root: Path | None = None) -> Path:
    """The most recently modified lipcli model file under ``root`` (default
    :func:`runs_root`), searched recursively; :class:`LipUsageError` naming the directory
    when there is none."""
    base = runs_root() if root is None else root
    where = f"{base}" + ("" if root is not None or os.environ.get(RUNS_ENV, "").strip() else
                         f" (set {RUNS_ENV} to search elsewhere)")
    if not base.is_dir():
        raise LipUsageError(f"no MODEL given and no runs directory {where}; pass a model file")
    candidates = sorted(
        (p for p in _suffixed_files(base) if p.is_file() and _is_model_file(p)),
        key=lambda p: (p.stat().st_mtime_ns, str(p)),
    )
    if not candidates:
        raise LipUsageError(f"no MODEL given and no model file (*{MODEL_SUFFIX}) under {where}; "
                            "pass a model file")
    return candidates[-1]


def resolve_model_argument(model: Path | None) -> Path:
    """``model`` as given (a missing file or a directory: :class:`LipUsageError`, exit 2, in
    every command), else :func:`latest_model` (announced on stderr)."""
    if model is not None:
        if model.is_dir():
            raise LipUsageError(f"{model} is a directory, not a model file")
        if not model.exists():
            raise LipUsageError(f"model file not found: {model}")
        return model
    found = latest_model()
    import sys

    print(f"using the most recent model {found}", file=sys.stderr)
    return found

"""Reading another project's checkpoint without running any of its code (``lip import``).

:func:`read_checkpoint` reads a PyTorch pickle (``torch.save``: zip or legacy), a safetensors
file or a NumPy ``.npz`` and returns its tensors by flattened name (nested dictionaries joined
with ``.``), the file's SHA-256 and its format.  What it guarantees (tested in
``tests/sdk/test_checkpoints*.py`` with hostile files made by the tests):

* **no code runs**: a ``torch.save`` file is loaded by torch's weights-only unpickler alone,
  with torch's built-in allowlist (:mod:`lipcli.sdk.torch_files`); nothing of lipcli's reads
  its pickles otherwise.  An ``.npz`` is read without pickles, a safetensors file holds none.
* **the format is the file's first bytes**: ``PK\\x03\\x04`` is a zip (a torch checkpoint, or an
  ``.npz`` when every member is a ``.npy``), an 8-byte length and ``{`` safetensors, a pickle
  protocol byte the legacy torch format; the file is memory-mapped, never read whole.
* **nothing is allocated beyond what the file holds**: storages are checked against the
  records' real bytes (torch's reader, and lipcli's own check of the zip directory and the
  legacy storages), compressed members bounded before they are inflated, and every tensor
  must be a real-valued, strided view inside its storage with no stride-0 (expanded) or
  overlapping dimension; all tensors of a torch pickle together may not hold more than
  :data:`MAX_SHARED_FACTOR` times the file's bytes.

Every refusal is one line (:class:`CheckpointError`, exit 1).
"""

from __future__ import annotations

import hashlib
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lipcli.sdk.torch_files import ZIP_MAGIC, CheckpointError, UnsafeCheckpointError, load_torch_file

__all__ = ["Checkpoint", "CheckpointError", "UnsafeCheckpointError", "read_checkpoint"]

#: the largest checkpoint read (a file beyond it is refused before it is mapped)
MAX_CHECKPOINT_BYTES = 8 << 30
#: the deepest nesting of containers flattened into names
MAX_DEPTH = 8
#: all tensors together may hold at most this many times the file's bytes (tied weights share
#: one storage; a view repeated a thousand times is refused)
MAX_SHARED_FACTOR = 4
#: the element types a checkpoint's tensors may have (real numbers; complex, quantised and
#: 8-bit floats are refused)
REAL_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                         torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})


@dataclass
class Checkpoint:
    """A checkpoint's tensors by flattened name, its other plain values, SHA-256 and format."""

    path: str
    tensors: dict[str, torch.Tensor]
    sha256: str
    format: str  # "torch-pickle", "safetensors" or "npz"
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in self.tensors.items()}


def _flatten(obj: Any, prefix: str, tensors: dict[str, torch.Tensor], values: dict[str, Any],
             depth: int) -> None:
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj.detach()
    elif isinstance(obj, dict) and depth < MAX_DEPTH:
        for key, value in obj.items():
            _flatten(value, f"{prefix}.{key}" if prefix else str(key), tensors, values, depth + 1)
    elif isinstance(obj, (int, float, str, bool)) or obj is None:
        values[prefix] = obj
    else:
        values[prefix] = f"<{type(obj).__name__}>"


def _check_tensor(path: Path, name: str, t: torch.Tensor) -> int:
    """Refuse a tensor that would make lipcli allocate more than its storage holds (see the
    module); its bytes."""
    if t.layout != torch.strided:
        raise CheckpointError(f"{path}: tensor {name!r} is {t.layout}, not a dense tensor")
    if t.dtype not in REAL_DTYPES:
        raise CheckpointError(f"{path}: tensor {name!r} has dtype {str(t.dtype).removeprefix('torch.')}; "
                              "lipcli imports real-valued weights only")
    if t.numel() == 0:
        return 0
    stored = t.untyped_storage().nbytes() // t.element_size()
    extent = 1  # elements spanned by the dimensions checked so far, smallest stride first
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s > 1):
        if stride == 0:
            raise CheckpointError(f"{path}: tensor {name!r} is a stride-0 (expanded) view declaring "
                                  f"{t.numel()} elements over {stored} stored; refused rather than expanded")
        if stride < extent:
            raise CheckpointError(f"{path}: tensor {name!r} is an overlapping view (shape {tuple(t.shape)}, "
                                  f"strides {t.stride()}); refused rather than expanded")
        extent += (size - 1) * stride
    if t.storage_offset() + extent > stored:
        raise CheckpointError(f"{path}: tensor {name!r} reaches beyond its storage")
    return t.numel() * t.element_size()


def _detect(view: mmap.mmap) -> str:
    """The format from the first bytes: ``zip``, ``safetensors`` or ``pickle``."""
    if view[:4] == ZIP_MAGIC:
        return "zip"
    if len(view) >= 9 and view[8:9] == b"{" and int.from_bytes(view[:8], "little") <= len(view) - 8:
        return "safetensors"
    return "pickle"


def _is_npz(view: mmap.mmap) -> bool:
    import zipfile

    from lipcli.sdk.torch_files import _MapReader

    try:
        names = zipfile.ZipFile(_MapReader(view)).namelist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError):
        return False
    return bool(names) and all(n.endswith(".npy") and "/" not in n for n in names)


def _read(path: Path, view: mmap.mmap) -> tuple[Any, str]:
    kind = _detect(view)
    if kind == "safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path)), "safetensors"
        except Exception as exc:  # noqa: BLE001 - safetensors' own error types
            raise CheckpointError(f"{path}: not a valid safetensors file: {' '.join(str(exc).split())}") from None
    if kind == "zip" and _is_npz(view):
        from lipcli.sdk.npz_files import read_npz

        return read_npz(path, view), "npz"
    return load_torch_file(path, view), "torch-pickle"


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read ``path`` safely (see the module); every problem is one :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    size = path.stat().st_size
    if size > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"{path}: {size} bytes, beyond the {MAX_CHECKPOINT_BYTES} a checkpoint may have")
    if size == 0:
        raise CheckpointError(f"{path}: an empty file, not a checkpoint")
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
            digest = hashlib.sha256(view).hexdigest()
            obj, fmt = _read(path, view)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    except MemoryError:
        raise CheckpointError(f"{path}: out of memory while reading it") from None
    tensors: dict[str, torch.Tensor] = {}
    values: dict[str, Any] = {}
    _flatten(obj, "", tensors, values, 0)
    if not tensors:
        raise CheckpointError(f"{path}: holds no tensors")
    held = sum(_check_tensor(path, name, t) for name, t in tensors.items())
    if fmt == "torch-pickle" and held > MAX_SHARED_FACTOR * size:
        raise CheckpointError(f"{path}: its tensors declare {held} bytes in all, more than "
                              f"{MAX_SHARED_FACTOR}x the file's {size} (views repeated over one storage)")
    return Checkpoint(path=str(path), tensors=tensors, sha256=digest, format=fmt, values=values)

"""Reading another project's checkpoint without running any of its code (``lip import``).

:func:`read_checkpoint` reads a PyTorch pickle (``torch.save``: zip or legacy), a safetensors
file or a NumPy ``.npz`` and returns its tensors by flattened name (nested dictionaries joined
with ``.``), the file's SHA-256 and its format.  A PyTorch pickle is checked *before* it is
unpickled: every global it names (``GLOBAL``/``STACK_GLOBAL`` opcodes, found with
:mod:`pickletools` without executing anything) must be in :data:`ALLOWED_GLOBALS` (tensor
rebuilding, storages, plain containers); anything else is refused with one line
(:class:`CheckpointError`, exit 1).  Only then is it loaded, and with
``torch.load(weights_only=True)`` as a second lock.  An ``.npz`` is read with
``allow_pickle=False``; a safetensors file holds no code at all.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickletools
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lipcli.sdk.errors import LipError

__all__ = [
    "ALLOWED_GLOBALS", "Checkpoint", "CheckpointError", "UnsafeCheckpointError",
    "pickle_globals", "read_checkpoint",
]

#: the largest checkpoint read (a file beyond it is refused before it is opened for parsing)
MAX_CHECKPOINT_BYTES = 8 << 30
#: the deepest nesting of containers flattened into names
MAX_DEPTH = 8

_STORAGES = ("Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte",
             "Bool", "ComplexFloat", "ComplexDouble")
#: ``module.name`` globals a state-dict pickle may name: tensor and parameter rebuilding,
#: typed storages, dtypes and ordered dictionaries (everything else is refused unread)
ALLOWED_GLOBALS: frozenset[str] = frozenset(
    {
        "collections.OrderedDict",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_parameter",
        "torch.Size",
        "torch.storage.UntypedStorage",
        "torch.UntypedStorage",
    }
    | {f"torch.{kind}Storage" for kind in _STORAGES}
    | {f"torch.{name}" for name in ("float64", "float32", "float16", "bfloat16", "int64",
                                    "int32", "int16", "int8", "uint8", "bool")}
)

_STRING_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE",
                         "SHORT_BINSTRING", "BINSTRING", "STRING"})
_MEMO_PUT = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_MEMO_GET = frozenset({"GET", "BINGET", "LONG_BINGET"})


class CheckpointError(LipError):
    """A checkpoint cannot be imported: unreadable, or not what its importer expects (exit 1)."""


class UnsafeCheckpointError(CheckpointError):
    """A pickle names a global beyond tensors and plain containers; nothing was unpickled."""


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


def pickle_globals(data: bytes) -> list[str]:
    """Every ``module.name`` a pickle stream names, read from its opcodes (nothing executed).

    ``STACK_GLOBAL`` takes its names from the two strings pushed before it (directly or from
    the memo); a ``STACK_GLOBAL`` whose names cannot be read that way is reported as
    ``"<unknown>"`` (and so refused)."""
    found: list[str] = []
    strings: list[str | None] = []  # the last values pushed, when they are strings
    memo: dict[int, str | None] = {}
    next_memo = 0
    for op, arg, _pos in pickletools.genops(data):
        name = op.name
        if name == "GLOBAL":
            module, _, attr = str(arg).partition(" ")
            found.append(f"{module}.{attr}")
            strings.append(None)
        elif name == "STACK_GLOBAL":
            pair = strings[-2:]
            if len(pair) == 2 and all(isinstance(s, str) for s in pair):
                found.append(f"{pair[0]}.{pair[1]}")
            else:
                found.append("<unknown>")
            del strings[-2:]
            strings.append(None)
        elif name in ("INST", "OBJ"):  # protocol 0/1 class instantiation: never in a state dict
            found.append(f"<{name} {arg}>")
        elif name in _STRING_OPS:
            strings.append(arg.decode("latin-1") if isinstance(arg, bytes) else str(arg))
        elif name == "MEMOIZE":
            memo[next_memo] = strings[-1] if strings else None
            next_memo += 1
        elif name in _MEMO_PUT:
            memo[int(arg)] = strings[-1] if strings else None
        elif name in _MEMO_GET:
            strings.append(memo.get(int(arg)))
        else:
            strings.append(None)
    return found


def _check_pickle(path: Path, data: bytes) -> None:
    try:
        names = pickle_globals(data)
    except Exception as exc:  # noqa: BLE001 - a malformed stream: refuse, never unpickle
        raise UnsafeCheckpointError(f"{path}: not a readable pickle ({type(exc).__name__}: {exc}); "
                                    "nothing was loaded") from None
    bad = sorted({n for n in names if n not in ALLOWED_GLOBALS})
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise UnsafeCheckpointError(
            f"{path}: refused: its pickle asks for {shown}, beyond tensors and plain containers "
            "(nothing was unpickled); save the state dict alone, or convert it to safetensors"
        )


def _torch_pickles(path: Path, raw: bytes) -> list[bytes]:
    """The pickle streams of a ``torch.save`` file: ``*/data.pkl`` of the zip format, or the
    whole legacy file (its several pickles concatenated; each is scanned in turn)."""
    if zipfile.is_zipfile(io.BytesIO(raw)):
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            names = [n for n in archive.namelist() if n.endswith(".pkl")]
            if not names:
                raise CheckpointError(f"{path}: a zip file without a pickle: not a torch checkpoint")
            return [archive.read(n) for n in names]
    streams, rest = [], raw
    while rest and len(streams) < 4:  # legacy: magic, protocol, sys info, then the object
        end = None
        for op, _arg, pos in pickletools.genops(rest):
            if op.name == "STOP":
                end = pos + 1
                break
        if end is None:
            break
        streams.append(rest[:end])
        rest = rest[end:]
        if len(streams) == 3:  # the object pickle is the fourth; storages follow raw
            streams.append(rest)
            break
    return streams or [raw]


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


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read ``path`` safely (see the module); every problem is one :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    size = path.stat().st_size
    if size > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"{path}: {size} bytes, beyond the {MAX_CHECKPOINT_BYTES} a checkpoint may have")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    digest = hashlib.sha256(raw).hexdigest()
    tensors: dict[str, torch.Tensor] = {}
    values: dict[str, Any] = {}
    if raw[8:9] == b"{" and path.suffix == ".safetensors":
        from safetensors.torch import load

        try:
            obj, fmt = load(raw), "safetensors"
        except Exception as exc:  # noqa: BLE001 - safetensors' own error types
            raise CheckpointError(f"{path}: not a valid safetensors file: {exc}") from None
    elif raw[:4] == b"PK\x03\x04" and path.suffix == ".npz":
        import numpy as np

        try:
            with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
                obj = {name: torch.from_numpy(np.array(npz[name])) for name in npz.files}
        except Exception as exc:  # noqa: BLE001 - a pickled array, a corrupt member
            raise CheckpointError(f"{path}: not a plain .npz of arrays: {exc}") from None
        fmt = "npz"
    else:
        try:
            streams = _torch_pickles(path, raw)
        except (ValueError, zipfile.BadZipFile, EOFError) as exc:  # not even a pickle stream
            raise CheckpointError(f"{path}: not a torch checkpoint, safetensors or .npz file ({exc})") from None
        for stream in streams:
            _check_pickle(path, stream)
        try:
            obj = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - whatever torch's unpickler raises
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CheckpointError(f"{path}: not a loadable torch checkpoint: {first}") from None
        fmt = "torch-pickle"
    _flatten(obj, "", tensors, values, 0)
    if not tensors:
        raise CheckpointError(f"{path}: holds no tensors")
    return Checkpoint(path=str(path), tensors=tensors, sha256=digest, format=fmt, values=values)

"""Reading a ``torch.save`` file with torch's weights-only unpickler, and nothing of lipcli's
in front of it that reads other bytes than torch does (:func:`lipcli.sdk.checkpoints.read_checkpoint`).

The format is torch's own test (``torch.serialization._is_zipfile``): a file that starts with
the zip signature ``PK\\x03\\x04`` is the zip format, any other the legacy format.

* **zip**: the central directory is read twice, by Python's :mod:`zipfile` and by torch's own
  reader (``torch._C.PyTorchFileReader``, the one ``torch.load`` uses); every record must be
  *stored* (``torch.save`` never compresses), lie inside the file, and have the same size and
  data offset in both readings, else the file is refused unread.  It is then loaded with
  ``torch.load(path, mmap=True, weights_only=True)``: the storages are views of the mapped
  file (torch checks each against its record's size), so nothing is inflated or copied.
* **legacy**: its pickles (magic number, protocol, system info, the object, the storage
  keys) are first read with torch's weights-only unpickler itself, in torch's order, with
  every storage created on the ``meta`` device (no memory); the raw storages that follow must
  then be exactly the declared ones (an 8-byte element count and the bytes, key by key) and
  end the file.  Only then does ``torch.load(weights_only=True)`` read it.

Either way the globals a pickle may name are torch's built-in weights-only allowlist alone
(safe globals another library added in this process are set aside for the load), and a
refusal is one line that never suggests turning the guard off.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import pickletools
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from lipcli.sdk.errors import LipError

__all__ = ["ZIP_MAGIC", "load_torch_file", "torch_error_line"]

ZIP_MAGIC = b"PK\x03\x04"
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # the zip local file header (30 bytes)
#: the pickles of the legacy format, in torch's reading order
_LEGACY_PICKLES = ("magic number", "protocol version", "system info", "object", "storage keys")
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001


class CheckpointError(LipError):
    """A checkpoint cannot be imported: unreadable, or not what its importer expects (exit 1)."""


class UnsafeCheckpointError(CheckpointError):
    """torch's weights-only unpickler refused the pickle: it names more than tensors and plain
    containers; no code from the file was run."""


def torch_error_line(exc: BaseException) -> str:
    """torch's message as one line, without its advice to load with ``weights_only=False``
    or to allow more globals (sentences naming either are dropped)."""
    import re

    text = str(exc).replace("WeightsUnpickler error:", "")
    advice = re.compile(r"weights_only|safe_globals|Check the documentation|Please file an issue|"
                        r"from a trusted source|Weights only load failed", re.I)
    sentences = re.split(r"(?<=[.!?])\s+|\n+", text)
    kept = [s.strip() for s in sentences if s.strip() and not advice.search(s)]
    line = " ".join(" ".join(kept).split()).rstrip(".")
    opcode = re.fullmatch(r"Unsupported operand (\d+)", line)
    if opcode and 0 <= int(opcode.group(1)) < 256:
        op = pickletools.code2op.get(chr(int(opcode.group(1))))
        line = f"pickle opcode {op.name if op else opcode.group(1)} is not one torch's weights-only unpickler reads"
    return line or "the pickle holds more than tensors and plain containers"


@contextlib.contextmanager
def _builtin_allowlist() -> Iterator[None]:
    """torch's built-in weights-only allowlist alone while the file is loaded."""
    import warnings

    ser = torch.serialization
    saved = list(ser.get_safe_globals())
    ser.clear_safe_globals()
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the refusal says it
            warnings.simplefilter("ignore")
            yield
    finally:
        if saved:
            ser.add_safe_globals(saved)


def _refuse(path: Path, exc: BaseException) -> CheckpointError:
    import pickle

    line = torch_error_line(exc)
    if isinstance(exc, pickle.UnpicklingError) or "Unsupported global" in line or "weights_only" in str(exc):
        return UnsafeCheckpointError(
            f"{path}: refused by torch's weights-only unpickler: {line} (no code from the file ran); "
            "save the state dict alone, or convert it to safetensors")
    if "storage that is not resizable" in str(exc):
        return CheckpointError(f"{path}: a tensor reaches beyond the bytes its storage holds")
    if isinstance(exc, MemoryError) or "can't allocate memory" in str(exc):
        return CheckpointError(f"{path}: out of memory while loading it")
    return CheckpointError(f"{path}: not a loadable torch checkpoint: {line}")


def _check_zip(path: Path, view: mmap.mmap, size: int) -> None:
    """Python's and torch's readings of the zip directory agree record by record (module)."""
    try:
        archive = zipfile.ZipFile(_MapReader(view))
        infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise CheckpointError(f"{path}: not a readable zip file ({exc})") from None
    ours: dict[str, tuple[int, int]] = {}
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise CheckpointError(f"{path}: zip member {info.filename!r} is compressed; torch.save "
                                  "stores its records uncompressed, so this is not its file")
        start = info.header_offset
        if start + _LOCAL_HEADER.size > size:
            raise CheckpointError(f"{path}: zip member {info.filename!r} lies outside the file")
        fields = _LOCAL_HEADER.unpack_from(view, start)
        data = start + _LOCAL_HEADER.size + fields[-2] + fields[-1]
        if fields[0] != ZIP_MAGIC or data + info.file_size > size:
            raise CheckpointError(f"{path}: zip member {info.filename!r} lies outside the file")
        ours[info.filename.partition("/")[2]] = (data, info.file_size)
    try:
        reader = torch._C.PyTorchFileReader(str(path))
        theirs = {name: (int(reader.get_record_offset(name)), int(reader.get_record_size(name)))
                  for name in reader.get_all_records()}
    except Exception as exc:  # noqa: BLE001 - torch's reader: RuntimeError and the like
        raise CheckpointError(f"{path}: not a torch checkpoint: {torch_error_line(exc)}") from None
    for name, (offset, length) in theirs.items():
        if ours.get(name) != (offset, length):
            raise CheckpointError(f"{path}: zip record {name!r} is read differently by torch and by "
                                  "Python's zipfile (a crafted directory); refused unread")
    if "data.pkl" not in theirs:
        raise CheckpointError(f"{path}: a zip file without data.pkl: not a torch checkpoint")


class _MapReader(io.RawIOBase):
    """A read-only, seekable file over a memory map (no copy)."""

    def __init__(self, view: mmap.mmap) -> None:
        self._view, self._pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, len(self._view))[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        chunk = self._view[self._pos:self._pos + len(buffer)]
        buffer[:len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)


def _check_legacy(path: Path, view: mmap.mmap, size: int) -> None:
    """Read the legacy pickles with torch's weights-only unpickler, storages on ``meta`` (no
    memory), and check the raw storages after them are exactly the declared ones."""
    from torch import _weights_only_unpickler as wou

    declared: dict[str, tuple[torch.dtype, int]] = {}
    storages: dict[str, Any] = {}

    def persistent_load(saved_id: Any) -> Any:
        if not isinstance(saved_id, tuple) or len(saved_id) != 6 or saved_id[0] not in ("storage", b"storage"):
            raise CheckpointError(f"{path}: a legacy persistent id that is not a storage")
        _kind, storage_type, key, _location, numel, view_metadata = saved_id
        dtype = getattr(storage_type, "dtype", None)
        if not isinstance(dtype, torch.dtype) or not isinstance(numel, int) or numel < 0:
            raise CheckpointError(f"{path}: a legacy storage of unknown type or size")
        if view_metadata is not None:
            raise CheckpointError(f"{path}: a legacy storage view (torch < 1.0); re-save it with a "
                                  "current torch.save")
        key = key.decode("ascii") if isinstance(key, bytes) else str(key)
        if key in declared and declared[key] != (dtype, numel):
            raise CheckpointError(f"{path}: legacy storage {key!r} is declared twice with other sizes")
        declared[key] = (dtype, numel)
        if key not in storages:
            meta = torch.UntypedStorage(numel * torch._utils._element_size(dtype), device="meta")
            storages[key] = torch.storage.TypedStorage(wrap_storage=meta, dtype=dtype, _internal=True)
        return storages[key]

    stream = _MapReader(view)
    values = []
    try:
        with _builtin_allowlist():
            for i, _what in enumerate(_LEGACY_PICKLES):
                unpickler = wou.Unpickler(stream, encoding="utf-8")
                if i == 3:
                    unpickler.persistent_load = persistent_load
                values.append(unpickler.load())
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever torch's unpickler raises
        raise _refuse(path, exc) from None
    for key, typed in storages.items():  # set_ grows a resizable storage a tensor overruns
        dtype, numel = declared[key]
        if typed._untyped_storage.nbytes() != numel * torch._utils._element_size(dtype):
            raise CheckpointError(f"{path}: a tensor reaches beyond its legacy storage {key!r} "
                                  f"({numel} elements declared)")
    if values[0] != _LEGACY_MAGIC or values[1] != _LEGACY_PROTOCOL:
        raise CheckpointError(f"{path}: not a torch checkpoint (no torch.save magic number)")
    keys = values[4]
    if not isinstance(keys, list) or any(str(k) not in declared for k in keys) or len(set(map(str, keys))) != len(keys):
        raise CheckpointError(f"{path}: the legacy storage keys do not match its storages")
    offset = stream.tell()
    for key in keys:
        dtype, numel = declared[str(key)]
        nbytes = numel * torch._utils._element_size(dtype)
        if offset + 8 > size or struct.unpack_from("<q", view, offset)[0] != numel or offset + 8 + nbytes > size:
            raise CheckpointError(f"{path}: legacy storage {str(key)!r} declares {nbytes} bytes that the "
                                  "file does not hold")
        offset += 8 + nbytes
    if offset != size:
        raise CheckpointError(f"{path}: {size - offset} bytes after the last legacy storage")


def load_torch_file(path: Path, view: mmap.mmap) -> Any:
    """The object a ``torch.save`` file holds, read as the module says."""
    size = len(view)
    zipped = view[:4] == ZIP_MAGIC
    if zipped:
        _check_zip(path, view, size)
    elif view[:1] != b"\x80":
        raise CheckpointError(f"{path}: not a torch checkpoint, safetensors or .npz file")
    else:
        _check_legacy(path, view, size)
    try:
        with _builtin_allowlist():
            if zipped:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            return torch.load(_MapReader(view), map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever torch's loader raises
        raise _refuse(path, exc) from None

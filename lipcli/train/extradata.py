"""Extra training images from an array file (``lip train --extra-data``), memory-mapped.

The format is the one generated-data releases use (e.g. the diffusion-model CIFAR sets that
the record holders train with): two arrays

* ``image``: ``uint8``, shape ``(N, H, W, C)`` (channels last, 0-255), ``H, W, C`` equal to
  the training set's images;
* ``label``: any integer dtype, shape ``(N,)``, values in ``0 .. num_classes - 1``;

stored either as an **uncompressed** ``.npz`` (``numpy.savez``, not ``savez_compressed``) or
as a directory holding ``image.npy`` and ``label.npy``.  Nothing is read into memory up
front: ``np.load(..., mmap_mode="r")`` maps the ``.npy`` files, and the members of an
uncompressed ``.npz`` (a zip archive whose members are stored byte for byte) are mapped at
their offsets inside the archive (``np.load`` cannot map ``.npz`` members itself).  A
compressed ``.npz`` cannot be mapped; it is refused with the command that converts it.
Only the labels are read completely (to check their range), and the file's SHA-256 is
computed once (streamed) for the model file's record.

Nothing in the file is trusted: each ``.npy`` header's shape must be non-negative and its
exact byte count must fit in the bytes stored (so a shape whose product wraps around in 64
bits is caught), and an archive member's recorded offset and size must lie inside the file.
Errors are :class:`~lipcli.sdk.errors.LipUsageError` with one line naming the file and what is
wrong; they are raised before anything is trained or written.
"""

from __future__ import annotations

import hashlib
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lipcli.sdk.errors import LipUsageError

IMAGE_KEY = "image"
LABEL_KEY = "label"
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # zip local file header (30 bytes)
_ZIP64 = 0xFFFFFFFF
_CONVERT_HINT = ("re-save it uncompressed: python -c \"import numpy as np; d = np.load('IN.npz'); "
                 "np.savez('OUT.npz', image=d['image'], label=d['label'])\"")


@dataclass
class ExtraData:
    """Memory-mapped extra training images and their labels (see the module docstring)."""

    path: Path
    images: np.ndarray  # (N, H, W, C) uint8, memory-mapped
    labels: np.ndarray  # (N,) integers
    sha256: str
    size_bytes: int

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)``, the layout of the training set's tensors."""
        _, h, w, c = self.images.shape
        return int(c), int(h), int(w)

    def record(self, ratio: float) -> dict[str, Any]:
        """The model file's ``training.extra_data`` record."""
        return {"path": str(self.path), "sha256": self.sha256, "bytes": self.size_bytes,
                "images": len(self), "image_shape": list(self.image_shape), "ratio": ratio}


def _fail(path: Path, message: str) -> LipUsageError:
    return LipUsageError(f"extra data {path}: {message}")


def _map_array(path: Path, file: Path, member: str, start: int, limit: int) -> np.ndarray:
    """Memory-map the ``.npy`` array stored in ``file`` from byte ``start`` up to ``limit``.

    The header is checked before anything is mapped: a known format version, no Python
    objects, a shape of non-negative integers whose byte count (computed exactly, so a shape
    whose product overflows 64 bits is caught) fits between the header's end and ``limit``.
    """
    with open(file, "rb") as fh:
        fh.seek(start)
        if fh.read(4) == b"PK\x03\x04":
            raise _fail(path, f"{member} is a zip archive (.npz), not a .npy array")
        fh.seek(start)
        try:
            version = np.lib.format.read_magic(fh)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
            reader = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                      else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = reader(fh)
        except (ValueError, OSError, SyntaxError, TypeError) as exc:
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise _fail(path, f"{member} is not a .npy array ({reason})") from None
        offset = fh.tell()
    if dtype.hasobject:
        raise _fail(path, f"{member} holds Python objects; only numeric arrays are read")
    if any(int(d) < 0 for d in shape):
        raise _fail(path, f"{member} declares a negative dimension {tuple(shape)}")
    nbytes = dtype.itemsize
    for d in shape:
        nbytes *= int(d)  # Python integers: no overflow
    if offset + nbytes > limit:
        raise _fail(path, f"{member} is truncated: shape {tuple(shape)} needs {nbytes} bytes, "
                          f"{max(limit - offset, 0)} are stored")
    return np.memmap(file, dtype=dtype, mode="r", offset=offset, shape=tuple(int(d) for d in shape),
                     order="F" if fortran else "C")


def _map_npz_member(path: Path, archive: zipfile.ZipFile, member: str) -> np.ndarray:
    """Memory-map the ``.npy`` member ``member`` of an uncompressed ``.npz``.

    The zip directory's sizes and offsets are not trusted: the member's bytes must lie inside
    the file, and the array inside the member's bytes.
    """
    info = archive.getinfo(member)
    if info.compress_type != zipfile.ZIP_STORED:
        raise _fail(path, f"{member} is compressed and cannot be memory-mapped; {_CONVERT_HINT}")
    file_size = path.stat().st_size
    if info.compress_size != info.file_size or info.header_offset + _LOCAL_HEADER.size > file_size:
        raise _fail(path, f"damaged zip archive (inconsistent sizes or offset for {member})")
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        fields = _LOCAL_HEADER.unpack(fh.read(_LOCAL_HEADER.size))
    if fields[0] != b"PK\x03\x04":
        raise _fail(path, f"damaged zip archive (no local header for {member})")
    local_sizes = (fields[7], fields[8])  # 0xFFFFFFFF: in the zip64 extra field (numpy.savez)
    if not fields[2] & 0x8 and _ZIP64 not in local_sizes and local_sizes != (info.compress_size, info.file_size):
        raise _fail(path, f"damaged zip archive (local and central sizes of {member} differ)")
    start = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
    end = start + info.file_size
    if end > file_size:
        raise _fail(path, f"damaged zip archive ({member} runs past the end of the file)")
    return _map_array(path, path, member, start, end)


def _load_npy(path: Path, file: Path) -> np.ndarray:
    return _map_array(path, file, file.name, 0, file.stat().st_size)


def _digest(files: list[Path]) -> tuple[str, int]:
    h, total = hashlib.sha256(), 0
    for file in files:
        with open(file, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
                total += len(chunk)
    return h.hexdigest(), total


def open_extra_data(path: str | Path) -> ExtraData:
    """Open (memory-map) ``path`` and check the arrays' kinds and shapes (module docstring)."""
    path = Path(path).expanduser()
    if path.is_dir():
        files = [path / f"{IMAGE_KEY}.npy", path / f"{LABEL_KEY}.npy"]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise _fail(path, f"a directory needs {IMAGE_KEY}.npy and {LABEL_KEY}.npy (missing {', '.join(missing)})")
        images, labels = (_load_npy(path, f) for f in files)
    elif path.is_file():
        files = [path]
        try:
            archive = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise _fail(path, f"not an .npz archive ({exc})") from None
        with archive:
            names = set(archive.namelist())
            missing = [k for k in (IMAGE_KEY, LABEL_KEY) if f"{k}.npy" not in names]
            if missing:
                found = ", ".join(sorted(n.removesuffix(".npy") for n in names)) or "nothing"
                raise _fail(path, f"needs arrays {IMAGE_KEY!r} and {LABEL_KEY!r}; found {found}")
            images = _map_npz_member(path, archive, f"{IMAGE_KEY}.npy")
            labels = _map_npz_member(path, archive, f"{LABEL_KEY}.npy")
    else:
        raise _fail(path, "no such file or directory")
    if images.dtype != np.uint8:
        raise _fail(path, f"'image' must be uint8 (0-255), got {images.dtype}")
    if images.ndim != 4:
        raise _fail(path, f"'image' must have shape (N, H, W, C), got {images.shape}")
    if images.shape[0] == 0:
        raise _fail(path, "'image' holds no images")
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise _fail(path, f"'label' must be integers of shape (N,), got {labels.dtype} {labels.shape}")
    if labels.shape[0] != images.shape[0]:
        raise _fail(path, f"{images.shape[0]} images but {labels.shape[0]} labels")
    digest, size = _digest(files)
    return ExtraData(path=path, images=images, labels=labels, sha256=digest, size_bytes=size)


def check_compatible(extra: ExtraData, *, image_shape: tuple[int, ...], num_classes: int) -> None:
    """The images must have the training set's ``(C, H, W)``; labels ``0 .. num_classes - 1``."""
    if tuple(extra.image_shape) != tuple(image_shape):
        c, h, w = image_shape
        raise _fail(extra.path, f"images are {extra.images.shape[1:]} (H, W, C) but the training set's "
                                f"are ({h}, {w}, {c})")
    low, high = int(extra.labels.min()), int(extra.labels.max())
    if low < 0 or high >= num_classes:
        raise _fail(extra.path, f"labels must be in 0..{num_classes - 1} (the data set's classes), "
                                f"found {low}..{high}")

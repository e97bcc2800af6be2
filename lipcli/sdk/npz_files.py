"""Reading a NumPy ``.npz`` without trusting what it declares (``lip import``).

Every member must be a ``.npy`` array of a plain (non-object) dtype.  Before a member is
inflated, its declared size is bounded by its stored size times :data:`MAX_RATIO` (plus
:data:`RATIO_SLACK` for small members) and the sum over the file by :data:`MAX_RATIO` times the
file's size; the array's header (read by NumPy's own header parser, bounded) must then
account for exactly the member's bytes, so nothing is allocated beyond what the member holds.
"""

from __future__ import annotations

import mmap
import zipfile
from pathlib import Path

import torch

from lipcli.sdk.torch_files import CheckpointError, _MapReader

__all__ = ["MAX_RATIO", "RATIO_SLACK", "read_npz"]

#: the largest inflated/stored ratio of an ``.npz`` (deflate of real weights is ~1.1; of zeros ~1000)
MAX_RATIO = 16
#: a member may inflate to this many bytes whatever its ratio (zero biases compress well)
RATIO_SLACK = 1 << 20
_HEADER_LIMIT = 10_000  # NumPy's own default max_header_size


def read_npz(path: Path, view: mmap.mmap) -> dict[str, torch.Tensor]:
    """The arrays of the ``.npz`` in ``view`` by member name (without ``.npy``)."""
    import numpy as np
    from numpy.lib import format as npformat

    try:
        archive = zipfile.ZipFile(_MapReader(view))
        infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise CheckpointError(f"{path}: not a readable zip file ({exc})") from None
    budget = MAX_RATIO * len(view) + RATIO_SLACK
    total = 0
    for info in infos:
        if not info.filename.endswith(".npy") or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise CheckpointError(f"{path}: not a plain .npz of arrays: member {info.filename!r}")
        total += info.file_size
        if info.file_size > MAX_RATIO * info.compress_size + RATIO_SLACK or total > budget:
            raise CheckpointError(
                f"{path}: member {info.filename!r} inflates {info.compress_size} stored bytes to "
                f"{info.file_size} (beyond {MAX_RATIO}x): a compression bomb, refused before inflating")
    out: dict[str, torch.Tensor] = {}
    for info in infos:
        name = info.filename[:-4]
        try:
            with archive.open(info) as member:
                version = npformat.read_magic(member)
                reader = {(1, 0): npformat.read_array_header_1_0, (2, 0): npformat.read_array_header_2_0}.get(version)
                if reader is None:
                    raise ValueError(f"unsupported .npy version {version}")
                shape, fortran, dtype = reader(member, max_header_size=_HEADER_LIMIT)
                if dtype.hasobject or dtype.kind not in "biuf" or not all(isinstance(s, int) and s >= 0 for s in shape):
                    raise ValueError(f"array {name!r} has dtype {dtype} (a pickled object or not a real number)")
                nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
                if member.tell() + nbytes != info.file_size:
                    raise ValueError(f"array {name!r} declares {nbytes} bytes, its member holds "
                                     f"{info.file_size - member.tell()}")
                data = member.read(nbytes)
        except (ValueError, zipfile.BadZipFile, EOFError, OSError) as exc:
            raise CheckpointError(f"{path}: not a plain .npz of arrays: {' '.join(str(exc).split())}") from None
        array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
        out[name] = torch.from_numpy(np.ascontiguousarray(array).astype(array.dtype.newbyteorder("="), copy=False).copy())
    return out

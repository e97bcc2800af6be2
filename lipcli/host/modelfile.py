"""The lipcli model file: one ``.safetensors`` file, tensors plus JSON metadata.

Layout of the safetensors metadata (string keys, JSON-encoded string values)::

    lipcli.format          "lipcli-model"          identifies the file as ours
    lipcli.format_version  1                       bumped on incompatible changes
    lipcli.version         "0.1.0"                 lipcli that wrote it
    lipcli.config          {...}                   full model config (see lipcli.host.models)
    lipcli.dataset         {...} | null            data set name, params, classes
    lipcli.normalization   {"mean": [...], "std": [...]}
    lipcli.lipschitz.bound       {...} | null            measured Lipschitz constant(s)
    lipcli.results         {...} | null            evaluation / certification results
    lipcli.training        {...} | null            training record (time, epochs, ...)
    lipcli.cache           {...} | null            per-model caches (e.g. CRC curvature bounds)

Writes are atomic (temporary file in the same directory, fsync, ``os.replace``).  Reading
parses only the safetensors header and raw tensor data: no code is ever executed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from lipcli.version import __version__
from lipcli.host.locks import FileLock, LockedError, output_lock_path
from lipcli.sdk.errors import LipError, ModelFileError

FORMAT_NAME = "lipcli-model"
FORMAT_VERSION = 1
PREFIX = "lipcli."
#: metadata slots every model file has (value may be null)
SLOTS = ("config", "dataset", "normalization", "lipschitz", "results", "training", "cache")
REQUIRED = ("format", "format_version", "version", "config")
#: limits on what a model file may ask a reader to parse (model files are untrusted input):
#: the safetensors header (tensor table + metadata), all metadata values together, and the
#: nesting depth of any one JSON value (a real file stays far below each)
MAX_HEADER_BYTES = 64 << 20
MAX_METADATA_BYTES = 4 << 20
MAX_JSON_DEPTH = 64


@dataclass
class ModelFile:
    """Parsed content of a model file."""

    tensors: dict[str, torch.Tensor]
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> dict[str, Any]:
        return self.metadata["config"]


def atomic_write_bytes(
    path: str | os.PathLike, data: bytes, *, check: Callable[[Path], None] | None = None
) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename.  ``check(tmp)`` (if
    given) runs on the complete temporary file before the rename; if it raises, the temporary
    file is removed and ``path`` is left as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual file mode
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if check is not None:
            check(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def encode_metadata(metadata: dict[str, Any]) -> dict[str, str]:
    out = {f"{PREFIX}format": json.dumps(FORMAT_NAME),
           f"{PREFIX}format_version": json.dumps(FORMAT_VERSION),
           f"{PREFIX}version": json.dumps(__version__)}
    for key, value in metadata.items():
        if key in ("format", "format_version", "version"):
            continue
        if not key.replace("_", "").isalnum():
            raise ValueError(f"bad metadata key {key!r}")
        out[PREFIX + key] = json.dumps(value, sort_keys=True, allow_nan=False)
    for slot in SLOTS:
        out.setdefault(PREFIX + slot, "null")
    return out


def save_model_file(
    path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, Any]
) -> Path:
    """Atomically write tensors and metadata (JSON-serialisable values) as safetensors."""
    from safetensors.torch import save

    path = Path(path)
    if "config" not in metadata:
        raise ValueError("metadata needs a 'config'")
    clean = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    try:
        blob = save(clean, metadata=encode_metadata(metadata))
    except ValueError as exc:  # non-finite numbers in metadata
        raise ModelFileError(f"cannot encode model metadata: {exc}") from None
    if not path.parent.exists():
        raise ModelFileError(f"cannot write {path}: directory {path.parent} does not exist")
    try:
        atomic_write_bytes(path, blob)
    except OSError as exc:
        raise ModelFileError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """Only the decoded lipcli metadata (cheap: reads the header)."""
    return _decode(path, _read_raw(path, tensors=False)[1])


def read_model_file(path: str | os.PathLike) -> ModelFile:
    """Read and validate a model file; every problem becomes a :class:`ModelFileError`."""
    tensors, raw = _read_raw(path, tensors=True)
    return ModelFile(tensors=tensors, metadata=_decode(path, raw))


def update_metadata(path: str | os.PathLike, updates: dict[str, Any]) -> None:
    """Atomically rewrite ``path`` with some metadata slots replaced."""
    mf = read_model_file(path)
    meta = dict(mf.metadata)
    meta.update(updates)
    save_model_file(path, mf.tensors, meta)


def tensors_fingerprint(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over tensors in name order (name, shape, dtype, bytes): identifies the weights
    that a stored value or result belongs to.  A model's state dict and the file it was
    loaded from give the same digest (:func:`lipcli.lipschitz.bound.weights_fingerprint`)."""
    digest = hashlib.sha256()
    for key, value in sorted(tensors.items()):
        t = value.detach().contiguous().cpu()
        digest.update(f"{key}|{tuple(t.shape)}|{t.dtype}|".encode())
        # reshape(-1): a 0-d tensor cannot be viewed as bytes directly
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


class ModelFileChangedError(LipError):
    """The model file's weights are no longer the ones a result was computed for (the file
    was replaced meanwhile); nothing was written (exit 1)."""


#: how long a write-back waits for the model file's lock (held briefly by another write-back,
#: for a whole run by ``lip train`` writing the same file)
LOCK_WAIT_S = 60.0


def update_results_locked(
    path: str | os.PathLike, update: Callable[[dict[str, Any]], dict[str, Any]], *,
    weights_sha256: str, what: str, wait_s: float = LOCK_WAIT_S,
) -> dict[str, Any]:
    """Write back results into the model file at ``path`` without losing anyone's update:
    under the file's lock (the one ``lip train`` holds on its output), re-read the file,
    refuse with :class:`ModelFileChangedError` unless its tensors still have the fingerprint
    ``weights_sha256`` (those ``what`` was computed for), then apply ``update(metadata)``
    (the slots to replace, merged into the current metadata by the caller) and rewrite it
    atomically.  Returns the slots written."""
    path = Path(path)
    lock = FileLock(output_lock_path(path), f"model file {path}")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            lock.acquire()
            break
        except LockedError as exc:
            if time.monotonic() >= deadline:
                who = f"process {exc.holder}" if exc.holder else "another process"
                raise LipError(f"model file {path} stayed locked by {who} (a lip train run writing "
                               f"it?) for {wait_s:g} s; {what} results not written") from None
            time.sleep(0.05)
    try:
        mf = read_model_file(path)
        if tensors_fingerprint(mf.tensors) != weights_sha256:
            raise ModelFileChangedError(
                f"model file {path} changed during {what} (its weights are no longer the ones "
                "evaluated); results not written"
            )
        updates = update(dict(mf.metadata))
        save_model_file(path, mf.tensors, {**mf.metadata, **updates})
        return updates
    finally:
        lock.release()


def _read_raw(path: str | os.PathLike, *, tensors: bool) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory, not a model file")
    _check_header_size(path)
    if not _utf8_name(path):
        return _read_by_python(path, tensors=tensors)
    try:
        out: dict[str, torch.Tensor] = {}
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            raw = fh.metadata() or {}
            if tensors:
                for key in fh.keys():
                    out[key] = fh.get_tensor(key)
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise _not_safetensors(path, exc) from None
    return out, raw


def _not_safetensors(path: Path, exc: Exception) -> ModelFileError:
    """The error for a file safetensors cannot parse (the first line of its message)."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ModelFileError(f"{path} is not a valid safetensors model file (truncated or corrupt?): {first}")


def _utf8_name(path: Path) -> bool:
    """Whether ``path`` is valid UTF-8 (safetensors opens files by a UTF-8 name only; a POSIX
    file name may be any bytes, which Python carries as surrogate escapes)."""
    try:
        os.fsdecode(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _read_by_python(path: Path, *, tensors: bool) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """:func:`_read_raw` for a file whose name is not UTF-8: Python opens it, safetensors
    parses the bytes (the header's ``__metadata__`` read as safetensors stores it)."""
    from safetensors.torch import load

    try:
        with open(path, "rb") as fh:
            data = fh.read() if tensors else fh.read(8)
            size = int.from_bytes(data[:8], "little")
            header = data[8:8 + size] if tensors else fh.read(size)
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        raw = json.loads(header).get("__metadata__") or {}
        out = load(data) if tensors else {}
        if not isinstance(raw, dict):
            raise ValueError("__metadata__ is not an object")
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise _not_safetensors(path, exc) from None
    return out, raw


def _check_header_size(path: Path) -> None:
    """Refuse a header larger than :data:`MAX_HEADER_BYTES` before safetensors parses it."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(head) == 8 and int.from_bytes(head, "little") > MAX_HEADER_BYTES:
        raise ModelFileError(
            f"bad model file: {path}: its header claims {int.from_bytes(head, 'little')} bytes "
            f"(limit {MAX_HEADER_BYTES})"
        )


def json_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in the JSON ``text`` (strings skipped), computed
    without recursion or a Python-level loop, so that a hostile value costs milliseconds."""
    import re

    import numpy as np

    # drop escapes (\\" included); then every other '"'-separated piece is outside a string
    outside = "".join(re.sub(r"\\.", "", text).split('"')[::2])
    codes = np.frombuffer(outside.encode("utf-8", "replace"), dtype=np.uint8)
    if not codes.size:
        return 0
    opens = (codes == ord("[")) | (codes == ord("{"))
    closes = (codes == ord("]")) | (codes == ord("}"))
    steps = opens.astype(np.int64) - closes
    return max(0, int(np.cumsum(steps).max()))


def _decode(path: str | os.PathLike, raw: dict[str, str]) -> dict[str, Any]:
    if f"{PREFIX}format" not in raw:
        raise ModelFileError(f"{path} is a safetensors file but not a lipcli model (no lipcli metadata)")
    size = sum(len(k) + len(v) for k, v in raw.items())
    if size > MAX_METADATA_BYTES:
        raise ModelFileError(
            f"bad model file: {path}: {size} bytes of metadata (limit {MAX_METADATA_BYTES})"
        )
    meta: dict[str, Any] = {}
    for key, value in raw.items():
        if not key.startswith(PREFIX):
            continue
        if json_depth(value) > MAX_JSON_DEPTH:
            raise ModelFileError(
                f"bad model file: {path}: metadata key {key!r} is nested deeper than "
                f"{MAX_JSON_DEPTH} levels"
            )
        try:
            meta[key[len(PREFIX):]] = json.loads(value)
        except (ValueError, RecursionError):  # JSONDecodeError, over-long integers
            raise ModelFileError(f"{path}: metadata key {key!r} is not valid JSON") from None
    for key in REQUIRED:
        if key not in meta:
            raise ModelFileError(f"{path}: metadata key {PREFIX}{key} is missing")
    if meta["format"] != FORMAT_NAME:
        raise ModelFileError(f"{path}: unknown format {meta['format']!r}")
    version = meta["format_version"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ModelFileError(
            f"{path}: metadata: format_version must be a positive integer, got {version!r}"
        )
    if version > FORMAT_VERSION:
        raise ModelFileError(
            f"{path}: format version {meta['format_version']!r} is newer than this lipcli "
            f"supports ({FORMAT_VERSION}); upgrade lipcli"
        )
    if not isinstance(meta["config"], dict):
        raise ModelFileError(f"{path}: metadata 'config' must be an object")
    for slot in SLOTS:
        meta.setdefault(slot, None)
    return meta

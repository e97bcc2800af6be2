"""Checkpoints: tensors + JSON, no pickle (state flattening, RNG states, atomic read/write)."""

from __future__ import annotations

import collections
import json
import math
import random
from pathlib import Path
from typing import Any

import torch

from lipcli.sdk.errors import LipError, LipUsageError
from lipcli.train.config import CHECKPOINT_FORMAT, CHECKPOINT_VERSION
from lipcli.host.modelfile import atomic_write_bytes


def flatten_state(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Turn a nested state (dicts, lists, tuples, Counters, tensors, numbers) into JSON + tensors.

    Every tensor is stored under a key starting with ``prefix`` and replaced by
    ``{"__tensor__": key}``; dicts with non-string keys, tuples, Counters and non-finite floats
    get tagged forms, so :func:`unflatten_state` restores the exact structure.
    """
    if isinstance(obj, torch.Tensor):
        key = f"{prefix}"
        tensors[key] = obj.detach().cpu().clone().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if isinstance(obj, collections.Counter):
        return {"__counter__": [[flatten_state(k, f"{prefix}.k{i}", tensors),
                                 flatten_state(v, f"{prefix}.{i}", tensors)]
                                for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: flatten_state(v, f"{prefix}.{k}", tensors) for k, v in obj.items()}
        return {"__items__": [[flatten_state(k, f"{prefix}.k{i}", tensors),
                               flatten_state(v, f"{prefix}.{i}", tensors)]
                              for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, tuple):
        return {"__tuple__": [flatten_state(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [flatten_state(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
    raise TypeError(f"cannot store {type(obj).__name__} at {prefix!r} in a checkpoint")


def unflatten_state(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`flatten_state`."""
    if isinstance(obj, list):
        return [unflatten_state(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        if set(obj) == {"__float__"}:
            return float(obj["__float__"])
        if set(obj) == {"__tuple__"}:
            return tuple(unflatten_state(v, tensors) for v in obj["__tuple__"])
        if set(obj) == {"__counter__"}:
            return collections.Counter(
                {unflatten_state(k, tensors): unflatten_state(v, tensors) for k, v in obj["__counter__"]}
            )
        if set(obj) == {"__items__"}:
            return {unflatten_state(k, tensors): unflatten_state(v, tensors) for k, v in obj["__items__"]}
        return {k: unflatten_state(v, tensors) for k, v in obj.items()}
    return obj


def rng_state() -> dict[str, Any]:
    """Torch (CPU and CUDA), numpy and Python RNG states as tensors + JSON."""
    import numpy as np

    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                      "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)}
    version, internal, gauss = random.getstate()
    state["python"] = {"version": int(version), "state": torch.tensor(internal, dtype=torch.int64),
                       "gauss": gauss}
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"].to(torch.uint8))
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([t.to(torch.uint8) for t in cuda])
    npst = state.get("numpy")
    if npst:
        np.random.set_state((npst["kind"], npst["keys"].numpy().astype(np.uint32), npst["pos"],
                             npst["has_gauss"], npst["cached"]))
    py = state.get("python")
    if py:
        random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))


def write_checkpoint(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Atomically write a checkpoint: safetensors with ``lipcli.checkpoint`` JSON metadata."""
    from safetensors.torch import save


    blob = save(tensors, metadata={"lipcli.checkpoint": json.dumps(meta, sort_keys=True, allow_nan=False)})
    try:
        atomic_write_bytes(path, blob)
    except OSError as exc:
        raise LipError(f"cannot write checkpoint {path}: {exc.strerror or exc}") from None


def read_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a checkpoint written by :func:`write_checkpoint` (clear errors, no code execution)."""
    from safetensors import safe_open

    if not path.is_file():
        raise LipUsageError(f"no checkpoint at {path} (is this a lip train run directory?)")
    try:
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            raw = (fh.metadata() or {}).get("lipcli.checkpoint")
            for key in fh.keys():
                tensors[key] = fh.get_tensor(key)
        meta = json.loads(raw) if raw else None
    except Exception as exc:  # noqa: BLE001
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LipError(f"{path} is not a readable checkpoint (truncated or corrupt?): {first}") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise LipError(f"{path} is not a lipcli training checkpoint")
    if int(meta.get("format_version", 0)) > CHECKPOINT_VERSION:
        raise LipError(f"{path} was written by a newer lipcli; upgrade to resume it")
    return tensors, meta


def _prefixed(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    n = len(prefix)
    return {k[n:]: v for k, v in tensors.items() if k.startswith(prefix)}

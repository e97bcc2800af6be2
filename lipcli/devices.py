"""The ``--device`` option of ``lip certify``, ``lip lipschitz`` and ``lip bench``: ``cpu``,
``cuda``, ``cuda:N`` or ``auto`` (CUDA when available), validated against this machine.
(``lip train`` resolves its device in :mod:`lipcli.train.distributed`, where each torchrun
process also picks its own GPU.)"""

from __future__ import annotations

import torch

from .errors import LipUsageError


def resolve_device(name: str) -> torch.device:
    """A validated :class:`torch.device` for ``name``; :class:`LipUsageError` (exit 2) for
    anything else (``meta``, ``mps``, a malformed or missing CUDA device)."""
    key = name.strip().lower()
    if key == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if key == "cpu":
        return torch.device("cpu")
    if key == "cuda" or key.startswith("cuda:"):
        try:
            dev = torch.device(key)
        except (RuntimeError, ValueError):
            raise LipUsageError(f"bad --device {name!r}; use cpu, cuda, cuda:N or auto") from None
        if not torch.cuda.is_available():
            raise LipUsageError(f"--device {name}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise LipUsageError(
                f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
        return dev
    raise LipUsageError(f"unknown --device {name!r}; use cpu, cuda, cuda:N or auto")

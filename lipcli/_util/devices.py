"""The device setting of every command: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (CUDA
when available).  :func:`check_device_name` checks the spelling only (``lip train`` checks its
configuration with it before anything runs); :func:`resolve_device` also checks it against
this machine.  ``lip train`` then gives a bare ``cuda`` each torchrun process's own GPU
(:meth:`lipcli.train.distributed.DistContext.resolve_device`)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from lipcli.sdk.errors import SettingError

if TYPE_CHECKING:
    import torch

#: the device used when none is named
DEFAULT_DEVICE = "auto"

#: ``cuda`` or ``cuda:N`` with N < 100 written without leading zeros (torch rejects those, and
#: keeps the index in 8 bits: ``torch.device("cuda:257")`` is ``cuda:1``)
_CUDA = re.compile(r"^cuda(:(0|[1-9]\d?))?$")


def check_device_name(name: str) -> str:
    """``name`` normalised (``auto``, ``cpu``, ``cuda`` or ``cuda:N``); :class:`SettingError`
    (``device``, exit 2) for anything else (``meta``, ``mps``, ``cuda:x``, ...)."""
    key = str(name).strip().lower()
    if key in ("auto", "cpu") or _CUDA.match(key):
        return key
    raise SettingError("device", f"unknown device {name!r}; use cpu, cuda, cuda:N or auto")


def resolve_device(name: str) -> "torch.device":
    """A validated :class:`torch.device` for ``name`` (see :func:`check_device_name`); a CUDA
    device must exist on this machine.  (torch is imported here: the CLI reads
    :data:`DEFAULT_DEVICE` without it.)"""
    import torch

    key = check_device_name(name)
    if key == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if key == "cpu":
        return torch.device("cpu")
    try:
        dev = torch.device(key)
    except (RuntimeError, ValueError):  # anything torch parses differently from the pattern
        raise SettingError("device", f"unknown device {name!r}; use cpu, cuda, cuda:N or auto") from None
    if not torch.cuda.is_available():
        raise SettingError("device", f"device {name}: CUDA is not available on this machine")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise SettingError(
            "device", f"device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return dev

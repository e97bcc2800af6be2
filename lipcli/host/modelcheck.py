"""A model file's config checked before and while the network is built (model files are
untrusted input).

:func:`check_config_limits` bounds the generic numbers (classes, channels, image size) and
every component parameter; :func:`guarded_build` then builds the network while checking
every tensor factory call against the sizes of the tensors actually in the file, so a config
forged to ask for far more -- ``width`` or ``num_classes`` set to ``10**9``, a head's
``hidden`` inflated -- is refused before the large tensor is allocated (the loader compares
the exact names and shapes right after).  Every failure is a
:class:`~lipcli.sdk.errors.ModelFileError` reading ``bad model file: PATH: ...`` (exit 1).
(Building on PyTorch's ``meta`` device instead would cost seconds per process: its first use
imports the compiler stack.)

Limits on the work a parameter asks for that no tensor shape reveals (SOC's ``eval_terms``,
LOT's ``iterations``) are the ranges its ``Param`` declares, checked when the config's
components are resolved (:meth:`~lipcli.sdk.specs.Param.check`); limits that depend on the
layer belong to the component's factory, which rejects out-of-range values (``ValueError``).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
from torch import nn

from lipcli.sdk.errors import ModelFileError

#: generic limits (far above any real model: CIFAR-100 has 100 classes, images 32 x 32)
from lipcli._util.constants import MAX_CLASSES  # noqa: E402,F401  (the model file's class limit, declared once)
MAX_CHANNELS = 1024
MAX_IMAGE_SIDE = 8192
#: a component parameter's absolute value (ints and floats); strings: length
MAX_PARAM_MAGNITUDE = 1 << 24
MAX_PARAM_TEXT = 1024


def bad(path: str | os.PathLike, reason: str) -> ModelFileError:
    return ModelFileError(f"bad model file: {path}: {reason}")


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_config_limits(path: str | os.PathLike, config: dict[str, Any], kinds: tuple[str, ...]) -> None:
    """Generic numbers and component parameters within sane limits (see module doc)."""
    if not _int_in(config.get("num_classes"), 2, MAX_CLASSES):
        raise bad(path, f"num_classes must be an integer from 2 to {MAX_CLASSES}, got "
                        f"{_short(config.get('num_classes'))}")
    if not _int_in(config.get("in_channels"), 1, MAX_CHANNELS):
        raise bad(path, f"in_channels must be an integer from 1 to {MAX_CHANNELS}, got "
                        f"{_short(config.get('in_channels'))}")
    size = config.get("image_size", [32, 32])
    if not (isinstance(size, list) and len(size) == 2 and all(_int_in(s, 1, MAX_IMAGE_SIDE) for s in size)):
        raise bad(path, f"image_size must be two integers from 1 to {MAX_IMAGE_SIDE}, got {_short(size)}")
    for kind in kinds:
        params = (config.get(kind) or {}).get("params") or {}
        if not isinstance(params, dict):
            continue  # reported by the caller's structural check
        for key, value in params.items():
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(value, (int, float)):
                if not abs(value) <= MAX_PARAM_MAGNITUDE:  # also NaN
                    raise bad(path, f"{kind} parameter {key!r} = {_short(value)} is out of range "
                                    f"(limit {MAX_PARAM_MAGNITUDE})")
            elif isinstance(value, str):
                if len(value) > MAX_PARAM_TEXT:
                    raise bad(path, f"{kind} parameter {key!r} is a {len(value)}-character string")
            else:
                raise bad(path, f"{kind} parameter {key!r} must be a number, string or boolean")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _TooLarge(Exception):
    def __init__(self, numel: int) -> None:
        self.numel = numel


def _requested_numel(func: Any, args: tuple, kwargs: dict[str, Any]) -> int | None:
    """Elements a tensor factory call asks for (``None`` when it cannot tell)."""
    import math

    def ints(seq: Any) -> list[int] | None:
        if isinstance(seq, (tuple, list, torch.Size)) and all(isinstance(v, int) for v in seq):
            return list(seq)
        return None

    name = getattr(func, "__name__", "")
    if "size" in kwargs and ints(kwargs["size"]) is not None:
        return math.prod(ints(kwargs["size"]))
    if name == "eye" and args and isinstance(args[0], int):
        return args[0] * (args[1] if len(args) > 1 and isinstance(args[1], int) else args[0])
    if name in ("arange", "range") and args and all(isinstance(a, (int, float)) for a in args[:3]):
        start, end, step = (0, args[0], 1) if len(args) == 1 else (*args[:2], args[2] if len(args) > 2 else 1)
        return int(abs((end - start) / step)) if step else None
    if name in ("linspace", "logspace") and len(args) > 2 and isinstance(args[2], int):
        return args[2]
    for arg in args:
        size = ints(arg)
        if size is not None:
            return math.prod(size)
    leading = []
    for arg in args:
        if not isinstance(arg, int) or isinstance(arg, bool):
            break
        leading.append(arg)
    return math.prod(leading) if leading else None


class BuildTooLarge(Exception):
    """:func:`budgeted_build`: the network asks for more bytes than the budget (``requested``)."""

    def __init__(self, requested: int, budget: int) -> None:
        super().__init__(f"{requested} bytes requested, {budget} available")
        self.requested, self.budget = requested, budget


def budgeted_build(build: Callable[[], nn.Module], budget: int | None) -> nn.Module:
    """``build()`` with its tensor factory calls summed (in bytes of the default dtype, at
    least 4 per element) and :class:`BuildTooLarge` raised *before* the call that would take
    the total over ``budget`` (``None``: no limit).  Architecture parameters that ask for a
    network far beyond the machine (``liresnet:depth=256,width=4096``) are so refused before
    the first large tensor exists, instead of allocating and then failing or being killed."""
    if budget is None:
        return build()
    from torch.overrides import TorchFunctionMode
    from torch.utils._device import _device_constructors

    factories = _device_constructors()
    per = max(4, torch.tensor([], dtype=torch.get_default_dtype()).element_size())

    class Budget(TorchFunctionMode):
        total = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in factories:
                numel = _requested_numel(func, args, kwargs)
                if numel is not None:
                    Budget.total += numel * per
                    if Budget.total > budget:
                        raise BuildTooLarge(Budget.total, budget)
            return func(*args, **kwargs)

    with Budget():
        return build()


def guarded_build(
    path: str | os.PathLike, build: Callable[[], nn.Module], tensors: dict[str, torch.Tensor],
) -> nn.Module:
    """``build()`` with every tensor factory call (``torch.empty``, ``randn``, ``zeros``, ...)
    checked first: a single tensor larger than 16 times the file's largest (at least 2**22
    elements), or more elements in all than 64 times the file's total (at least 2**26), is
    refused before it is allocated.  The exact names and shapes are compared by the caller
    once the (then small) network exists."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._device import _device_constructors

    factories = _device_constructors()
    sizes = [t.numel() for t in tensors.values()] or [0]
    single_limit = max(16 * max(sizes), 1 << 22)
    total_limit = max(64 * sum(sizes), 1 << 26)

    class Guard(TorchFunctionMode):
        total = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in factories:
                numel = _requested_numel(func, args, kwargs)
                if numel is not None:
                    Guard.total += numel
                    if numel > single_limit or Guard.total > total_limit:
                        raise _TooLarge(numel)
            return func(*args, **kwargs)

    try:
        with Guard():
            return build()
    except _TooLarge as exc:
        raise bad(path, f"the model config asks for a tensor of {exc.numel} elements, far more "
                        "than the file holds (forged or mismatched config)") from None

"""Conformance check of any component spec (re-exported by :mod:`lipcli.testing`):
:func:`check_component_spec`."""

from __future__ import annotations

import inspect
from typing import Any

from lipcli.sdk.specs import SPEC_KINDS, ComponentSpec, DatasetSpec, HeadSpec, Param
from lipcli.testing.base import fail
from lipcli.testing.ranges import check_param_ranges

__all__ = ["check_component_spec"]

#: characters a component name must not contain (``name:key=value,key=value`` syntax)
_RESERVED_NAME_CHARS = frozenset(":,= \t\n")

#: placeholder positional / keyword arguments per kind, to test factory signatures
_FACTORY_CALLS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "conv": ((8, 8, 3, 1), {}),
    "activation": ((8,), {}),
    "pool": ((8,), {}),
    "head": ((8, 10), {}),
    "certificate": ((), {}),
    "arch": ((), dict.fromkeys(
        ("conv", "activation", "pool", "head", "num_classes", "in_channels", "mean", "std")
    )),
    "dataset": (("root", "train"), {"download": False, "augment": False}),
    "loss": ((None,), {}),
    "augmentation": ((None,), {}),
    "optimizer": ((None,), {}),
}


def fail(message: str) -> None:
    raise AssertionError(message)


# ---------------------------------------------------------------------------------------------
# specs
# ---------------------------------------------------------------------------------------------
def check_component_spec(spec: ComponentSpec) -> None:
    """Check a spec of any kind (see the module docstring); raise AssertionError if bad."""
    if not isinstance(spec, ComponentSpec):
        fail(f"expected a lipcli spec object, got {type(spec).__name__}")
    label = f"{spec.kind} {spec.name!r}"
    if SPEC_KINDS.get(spec.kind) is not type(spec):
        fail(f"{label}: spec class {type(spec).__name__} is not the registered class for "
             f"kind {spec.kind!r}; subclassing spec classes is not supported")
    if not isinstance(spec.name, str) or not spec.name or set(spec.name) & _RESERVED_NAME_CHARS:
        fail(f"{label}: the name must be a non-empty string without spaces, ':', ',' or '='")
    if not isinstance(spec.description, str) or not spec.description.strip():
        fail(f"{label}: the description must be a non-empty string")
    if "\n" in spec.description.strip():
        fail(f"{label}: the description must be one line (it is shown in `lip plugins`)")
    if not isinstance(spec.promises, tuple) or not all(
        isinstance(p, str) and p.strip() for p in spec.promises
    ):
        fail(f"{label}: promises must be a tuple of non-empty strings, got {spec.promises!r}")
    if not isinstance(spec.params, tuple):
        fail(f"{label}: params must be a tuple of Param, got {type(spec.params).__name__}")
    for param in spec.params:
        if not isinstance(param, Param):
            fail(f"{label}: params must be Param objects, got {type(param).__name__}")
        try:
            checked = param.check(param.default)
        except ValueError as exc:
            fail(f"{label}: the default of parameter {param.name!r} does not validate: {exc}")
        try:
            parsed = param.parse(_as_cli_text(checked))
        except ValueError as exc:
            fail(f"{label}: parameter {param.name!r}: its default written on the command "
                 f"line does not parse back: {exc}")
        if parsed != checked:
            fail(f"{label}: parameter {param.name!r}: default {checked!r} parses back as "
                 f"{parsed!r}")
    check_param_ranges(spec)  # each declared range: edges accepted, one step beyond refused
    try:
        defaults = spec.resolve_params()
    except (KeyError, ValueError) as exc:
        fail(f"{label}: resolve_params() failed: {exc}")
    if isinstance(spec, HeadSpec) and (not isinstance(spec.certificate, str) or not spec.certificate):
        fail(f"{label}: a head must name its certificate method")
    if isinstance(spec, DatasetSpec):
        _check_dataset_fields(spec, label)
    _check_factory_signature(spec, label, defaults)


def _as_cli_text(value: Any) -> str:
    """How a user would write ``value`` on the command line (``key=value``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _check_dataset_fields(spec: DatasetSpec, label: str) -> None:
    if spec.num_classes is not None and (not isinstance(spec.num_classes, int) or spec.num_classes < 2):
        fail(f"{label}: num_classes must be None or an integer >= 2")
    if len(spec.image_shape) != 3 or not all(isinstance(s, int) and s > 0 for s in spec.image_shape):
        fail(f"{label}: image_shape must be (C, H, W) positive integers")
    channels = spec.image_shape[0]
    if len(spec.mean) != channels or len(spec.std) != channels:
        fail(f"{label}: mean and std need one entry per image channel ({channels})")
    if min(spec.std) <= 0:
        fail(f"{label}: std must be positive")


def _check_factory_signature(spec: ComponentSpec, label: str, defaults: dict[str, Any]) -> None:
    try:
        signature = inspect.signature(spec.factory)
    except (TypeError, ValueError):  # builtins / C callables: nothing to check
        return
    args, kwargs = _FACTORY_CALLS.get(spec.kind, ((), {}))
    try:
        signature.bind(*args, **kwargs, **defaults)
    except TypeError as exc:
        expected = ", ".join([*(repr(a) for a in args), *(f"{k}=..." for k in (*kwargs, *defaults))])
        fail(f"{label}: the factory cannot be called as factory({expected}): {exc}")


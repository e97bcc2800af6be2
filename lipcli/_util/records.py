"""Typed results -> JSON: the one path from a driver's result dataclasses to the dicts that
``--json``, the model file's ``results`` slot and reports print (:func:`to_json`).

Field order is the JSON key order.  A dataclass may name fields that are left out of the
JSON while they are ``None`` (``JSON_OMIT_NONE``): keys that exist only in some runs (e.g.
the PGD columns of a certified-accuracy row) stay absent instead of ``null``.  A field
declared with ``field(metadata=INLINE)`` holds a part whose keys stand in the parent's JSON
at the field's place (nothing while it is ``None``): one part shared by several results
(e.g. the step times of a benchmark row) without a nesting level the JSON never had.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

#: ``dataclasses.field(metadata=INLINE)``: the field's own keys are written into the parent
INLINE: dict[str, bool] = {"json_inline": True}


def to_json(value: Any) -> Any:
    """``value`` with every dataclass turned into a dict (recursively; lists, tuples and dicts
    walked), fields in declaration order, ``JSON_OMIT_NONE`` fields left out while ``None``,
    :data:`INLINE` fields' keys spliced in at their place; an object with its own ``to_json()`` (not a :class:`JsonRecord`) is asked for it."""
    if not isinstance(value, (type, JsonRecord)) and callable(getattr(value, "to_json", None)):
        return to_json(value.to_json())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        omit = getattr(value, "JSON_OMIT_NONE", ())
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if item is None and (f.name in omit or f.metadata.get("json_inline")):
                continue
            if f.metadata.get("json_inline"):
                out.update(to_json(item))
            else:
                out[f.name] = to_json(item)
        return out
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_json(v) for v in value)
    return value


class JsonRecord:
    """Mixin for result dataclasses: ``record.to_json()`` is :func:`to_json` of it."""

    JSON_OMIT_NONE: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

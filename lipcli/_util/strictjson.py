"""Strict JSON for everything lipcli writes (``--json`` output, bench reports, model-file
metadata): non-finite floats -- e.g. an infinite certified radius -- become the strings
``"inf"``, ``"-inf"`` and ``"nan"``, which ``float()`` in any language reads back, instead of
the invalid ``Infinity``/``NaN`` tokens."""

from __future__ import annotations

import json
import math
from typing import Any


def strict_json(data: Any) -> Any:
    """Copy of ``data`` that is valid strict JSON (non-finite floats as strings)."""
    if isinstance(data, float) and not math.isfinite(data):
        return "nan" if math.isnan(data) else ("inf" if data > 0 else "-inf")
    if isinstance(data, dict):
        return {k: strict_json(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [strict_json(v) for v in data]
    return data


def dumps_json(data: Any) -> str:
    """Strict JSON text (see :func:`strict_json`), indented."""
    return json.dumps(strict_json(data), indent=2, sort_keys=False, default=str, allow_nan=False)

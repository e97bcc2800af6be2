"""Text from files is data, not terminal input: strip control characters before echoing it,
and suggest ``pip install NAME`` only for a NAME that is a valid distribution name.

A model file is untrusted input.  Its strings (component and data-set names, class names,
distribution names, notes) reach error lines and tables; an ESC byte there would drive the
terminal (``ESC[2J`` clears it), and a "distribution name" such as ``x && curl ... | sh``
inside a suggested command would invite the user to run it.
"""

from __future__ import annotations

import re
from typing import Any

#: C0 controls (newlines and tabs included), DEL, C1 controls; plus the Unicode bidi
#: overrides/isolates that can reorder what a terminal shows
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

#: PEP 508 / packaging: a distribution name (letters, digits, ``.``, ``_``, ``-``; starting
#: and ending with a letter or digit)
_DIST_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)


def clean(text: Any) -> str:
    """``str(text)`` with every control character removed (newlines and tabs become spaces)."""
    return _CONTROL.sub(lambda m: " " if m.group() in "\n\t\r" else "", str(text))


def clean_tree(data: Any) -> Any:
    """A copy of a JSON-like structure with :func:`clean` applied to every string (keys too)."""
    if isinstance(data, str):
        return clean(data)
    if isinstance(data, dict):
        return {clean_tree(k): clean_tree(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [clean_tree(v) for v in data]
    return data


def is_distribution_name(name: Any) -> bool:
    """Whether ``name`` is a valid distribution name (PEP 508 ``identifier``)."""
    return isinstance(name, str) and len(name) <= 200 and bool(_DIST_NAME.match(name))


def install_hint(distribution: Any, fallback: str = "") -> str:
    """``pip install NAME`` for a valid name; otherwise a note that the recorded name is not
    one (shown escaped) and ``fallback`` if given."""
    if is_distribution_name(distribution):
        return f"pip install {distribution}"
    note = f"the recorded distribution name {clean(repr(distribution))[:80]} is not a valid package name"
    return f"{note}; {fallback}" if fallback else note

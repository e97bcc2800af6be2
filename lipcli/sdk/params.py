"""A component's typed parameter (:class:`Param`, part of every spec in :mod:`lipcli.sdk.specs`,
which re-exports it): its type, default, range or choices, and how a command-line value is read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the types a parameter (and a recipe value) may have
PARAM_TYPES = (int, float, str, bool)


@dataclass(frozen=True, kw_only=True)
class Param:
    """A typed, defaulted parameter of a component (``name=value`` on the command line)."""

    name: str
    type: type
    default: Any
    help: str = ""
    choices: tuple[Any, ...] | None = None
    #: a ``loss`` parameter only: a setting of its own (a settings-file key and the ``lip
    #: train`` option ``--KEY`` with ``_`` written ``-``) that sets this parameter of whichever
    #: loss is chosen, e.g. ``attack_radius`` for ``crc-lip``'s ``radius``; ``None``: only
    #: inline (``--loss NAME:name=value``)
    shortcut: str | None = None
    #: the declared range of an ``int`` or ``float`` parameter (inclusive; ``None``: open
    #: that side): it keeps the memory and time a value asks for proportional to what a user
    #: could mean; :meth:`check` refuses a value outside it (command line and model files)
    min: int | float | None = None
    max: int | float | None = None
    #: ``min`` itself excluded (a ``float`` that must be positive: ``min=0.0, min_open=True``)
    min_open: bool = False
    #: ``max`` itself excluded
    max_open: bool = False
    #: an ``int`` that must be odd (a kernel size)
    odd: bool = False
    #: a value accepted outside the range that means "chosen automatically" (``0`` for SLL's
    #: ``kernel``: the architecture's)
    auto: int | float | None = None

    def __post_init__(self) -> None:
        if self.type not in PARAM_TYPES:
            raise TypeError(f"Param {self.name!r}: type must be one of int, float, str, bool")
        if not self.name.isidentifier():
            raise ValueError(f"Param name {self.name!r} is not a valid identifier")
        if self.shortcut is not None and not (self.shortcut.isidentifier() and self.shortcut.islower()):
            raise ValueError(f"Param {self.name!r}: shortcut {self.shortcut!r} is not a lower-case identifier")
        if self.has_range:
            if self.type not in (int, float):
                raise TypeError(f"Param {self.name!r}: only int and float parameters take a range")
            if self.odd and self.type is not int:
                raise TypeError(f"Param {self.name!r}: odd is for int parameters")
            if self.min is not None and self.max is not None and not self.min <= self.max:
                raise ValueError(f"Param {self.name!r}: min {self.min} is above max {self.max}")
            self.check(self.default)  # a default outside its own range is a spec bug

    @property
    def has_range(self) -> bool:
        """Whether a range (``min``, ``max``, ``odd``) is declared."""
        return self.min is not None or self.max is not None or self.odd

    def range_text(self) -> str:
        """The declared range in words, e.g. ``"1..1000"``, ``"(0, 1]"``, ``"an odd number in 1..15 (or 0)"``."""
        if self.type is int and not (self.min_open or self.max_open):
            low = "" if self.min is None else str(self.min)
            text = f"{low}..{'' if self.max is None else self.max}"
        else:
            low = "(-inf" if self.min is None else f"{'(' if self.min_open else '['}{self.min:g}"
            high = "inf)" if self.max is None else f"{self.max:g}{')' if self.max_open else ']'}"
            text = f"{low}, {high}"
        if self.odd:
            text = f"an odd number in {text}"
        return text if self.auto is None else f"{text} (or {self.auto})"

    def _in_range(self, value: int | float) -> bool:
        if self.auto is not None and value == self.auto:
            return True
        if self.min is not None and not (value > self.min if self.min_open else value >= self.min):
            return False
        if self.max is not None and not (value < self.max if self.max_open else value <= self.max):
            return False
        return not (self.odd and value % 2 == 0) and value == value  # NaN is in no range

    def parse(self, text: str) -> Any:
        """Convert a command-line string to this parameter's type (``ValueError`` if bad)."""
        if self.type is bool:
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                value: Any = True
            elif low in ("0", "false", "no", "off"):
                value = False
            else:
                raise ValueError(f"{self.name}: expected true/false, got {text!r}")
        else:
            try:
                value = self.type(text)
            except ValueError:
                raise ValueError(
                    f"{self.name}: expected {self.type.__name__}, got {text!r}"
                ) from None
        return self.check(value)

    def check(self, value: Any) -> Any:
        """Validate (and coerce int -> float) a Python value for this parameter."""
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            raise ValueError(
                f"{self.name}: expected {self.type.__name__}, got {type(value).__name__}"
            )
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{self.name}: must be one of {', '.join(map(str, self.choices))}")
        if self.has_range and not self._in_range(value):
            raise ValueError(f"{self.name} must be {'' if self.odd else 'in '}{self.range_text()}, got {value!r}")
        return value
